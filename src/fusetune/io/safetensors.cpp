#include "fusetune/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <tuple>

#include <nlohmann/json.hpp>

#include "fusetune/util/error.h"
#include "fusetune/util/fs.h"

namespace fs = std::filesystem;

namespace fusetune {
namespace {

// The reference implementation refuses headers above 100 MB; so do we (a corrupt length
// field must not make us allocate gigabytes).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

const char* kSupportedDtypes = "F32, F64, BF16, F16, I32, I64";

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::string json_kind(const nlohmann::ordered_json& j) { return j.type_name(); }

// A tensor entry's fields, checked one by one so the error says which is wrong.
TensorInfo parse_entry(const std::string& file, const std::string& name,
                       const nlohmann::ordered_json& e) {
  auto fail = [&](const std::string& what) {
    return Error(file + ": tensor '" + printable(name) + "': " + what);
  };
  if (!e.is_object()) throw fail("header entry is a JSON " + json_kind(e) + ", expected an object");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!e.contains(key)) throw fail(std::string("header entry has no '") + key + "'");
  TensorInfo info;
  const auto& dt = e["dtype"];
  if (!dt.is_string()) throw fail("'dtype' is a JSON " + json_kind(dt) + ", expected a string");
  if (!dtype_from_name(dt.get<std::string>(), &info.dtype))
    throw fail("dtype '" + printable(dt.get<std::string>()) +
               "' is not supported (supported: " + kSupportedDtypes + ")");
  const auto& sh = e["shape"];
  if (!sh.is_array()) throw fail("'shape' is a JSON " + json_kind(sh) + ", expected an array");
  // numel * element size must fit in an int64 (so numel() and nbytes() cannot overflow).
  uint64_t bytes = dtype_size(info.dtype);
  for (const auto& d : sh) {
    if (!d.is_number_unsigned())
      throw fail("shape " + sh.dump() + " has an entry that is not a non-negative integer");
    uint64_t v = d.get<uint64_t>();
    if (v > uint64_t(std::numeric_limits<int64_t>::max()))
      throw fail("shape " + sh.dump() + " is too large");
    info.shape.push_back(int64_t(v));
    if (__builtin_mul_overflow(bytes, v, &bytes) ||
        bytes > uint64_t(std::numeric_limits<int64_t>::max()))
      throw fail("shape " + sh.dump() + " is too large");
  }
  const auto& off = e["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
      !off[1].is_number_unsigned())
    throw fail("'data_offsets' " + off.dump() + " is not [begin, end] with non-negative integers");
  info.begin = off[0].get<uint64_t>();
  info.end = off[1].get<uint64_t>();
  if (info.end < info.begin) throw fail("data_offsets " + off.dump() + " end before they begin");
  if (bytes != info.end - info.begin)
    throw fail("data_offsets " + off.dump() + " span " + std::to_string(info.end - info.begin) +
               " bytes but dtype " + dtype_name(info.dtype) + " and shape " +
               shape_str(info.shape) + " need " + std::to_string(bytes));
  return info;
}

}  // namespace

std::string printable(std::string_view s) {
  std::string out;
  for (unsigned char ch : s) {
    if (ch < 0x20 || ch == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", ch);
      out += buf;
    } else {
      out += char(ch);
    }
  }
  return out;
}

SafetensorsFile SafetensorsFile::open(const fs::path& path) {
  const std::string file = path.string();
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FT_CHECK(fd >= 0, file + ": cannot open safetensors file: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(file + ": not a regular file");
  }
  const size_t size = size_t(st.st_size);
  if (size < 8) {
    ::close(fd);
    throw Error(file + ": truncated safetensors file (" + std::to_string(size) +
                " bytes; the 8-byte header length alone needs 8)");
  }
  // Private + writable = copy-on-write: tensors can be updated in place in memory, the file
  // (opened read-only) never changes, and untouched pages cost nothing.
  void* addr = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);
  FT_CHECK(addr != MAP_FAILED, file + ": cannot mmap: " + std::strerror(err));
  std::shared_ptr<const void> owner(
      addr, [size](const void* p) { ::munmap(const_cast<void*>(p), size); });
  SafetensorsFile f = from_memory(addr, size, std::move(owner), file);
  f.writable_ = true;
  f.map_begin_ = static_cast<const uint8_t*>(addr);
  f.map_size_ = size;
  return f;
}

SafetensorsFile SafetensorsFile::from_memory(const void* data, size_t size,
                                             std::shared_ptr<const void> owner, std::string name) {
  SafetensorsFile f;
  f.name_ = std::move(name);
  f.owner_ = std::move(owner);
  const std::string& file = f.name_;
  const auto* bytes = static_cast<const uint8_t*>(data);
  FT_CHECK(size >= 8, file + ": truncated safetensors file (" + std::to_string(size) +
                          " bytes; the 8-byte header length alone needs 8)");
  const uint64_t n = read_u64_le(bytes);
  FT_CHECK(n <= kMaxHeaderBytes, file + ": header length " + std::to_string(n) +
                                     " is implausible (limit " + std::to_string(kMaxHeaderBytes) +
                                     "); not a safetensors file?");
  FT_CHECK(n <= size - 8, file + ": header length " + std::to_string(n) +
                              " runs past the end of the " + std::to_string(size) +
                              "-byte file; file truncated?");
  FT_CHECK(n >= 2 && bytes[8] == '{',
           file + ": header does not start with '{'; not a safetensors file?");
  nlohmann::ordered_json header;
  try {
    header = nlohmann::ordered_json::parse(bytes + 8, bytes + 8 + n);
  } catch (const nlohmann::json::exception& e) {
    throw Error(file + ": header is not valid JSON (" + e.what() + ")");
  }
  FT_CHECK(header.is_object(),
           file + ": header is a JSON " + header.type_name() + ", expected an object");
  const uint64_t data_size = size - 8 - n;
  f.data_ = bytes + 8 + n;

  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      FT_CHECK(value.is_object(), file + ": '__metadata__' is a JSON " + value.type_name() +
                                      ", expected an object of strings");
      for (const auto& [mk, mv] : value.items()) {
        FT_CHECK(mv.is_string(), file + ": '__metadata__' entry '" + printable(mk) +
                                     "' is a JSON " + mv.type_name() + ", expected a string");
        f.metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    TensorInfo info = parse_entry(file, key, value);
    FT_CHECK(info.end <= data_size, file + ": tensor '" + printable(key) + "': data_offsets [" +
                                        std::to_string(info.begin) + ", " +
                                        std::to_string(info.end) + "] run past the end of the " +
                                        std::to_string(data_size) +
                                        "-byte data section; file truncated?");
    FT_CHECK(f.infos_.emplace(key, info).second,
             file + ": tensor '" + printable(key) + "' appears twice");
    f.names_.push_back(key);
  }

  // Tensors must tile the data section: sorted by offset, each starts where the last ended.
  std::vector<std::tuple<uint64_t, uint64_t, const std::string*>> spans;
  for (const auto& tname : f.names_) {
    const auto& i = f.infos_.at(tname);
    spans.emplace_back(i.begin, i.end, &tname);
  }
  std::sort(spans.begin(), spans.end());
  uint64_t pos = 0;
  const std::string* prev = nullptr;
  for (const auto& [b, e, tname] : spans) {
    FT_CHECK(b >= pos, file + ": tensor '" + printable(*tname) + "' (bytes " + std::to_string(b) +
                           ".." + std::to_string(e) + ") overlaps tensor '" +
                           printable(prev ? *prev : "") + "'");
    FT_CHECK(b == pos, file + ": gap in the data section before tensor '" + printable(*tname) +
                           "' (bytes " + std::to_string(pos) + ".." + std::to_string(b) +
                           " belong to no tensor)");
    pos = e;
    prev = tname;
  }
  FT_CHECK(pos == data_size, file + ": data section has " + std::to_string(data_size) +
                                 " bytes but its tensors cover only " + std::to_string(pos) +
                                 " (trailing bytes)");
  return f;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = infos_.find(name);
  FT_CHECK(it != infos_.end(), name_ + ": no tensor '" + printable(name) + "'");
  return it->second;
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  const TensorInfo& i = info(name);
  const uint8_t* p = data_ + i.begin;
  const bool aligned = reinterpret_cast<uintptr_t>(p) % dtype_size(i.dtype) == 0;
  if (writable_ && aligned)
    return Tensor::borrow(const_cast<uint8_t*>(p), i.shape, i.dtype, owner_);
  Tensor t = Tensor::empty(i.shape, i.dtype);
  if (t.nbytes()) std::memcpy(t.raw(), p, t.nbytes());
  return t;
}

namespace {

// Element i of `n` elements of dtype `from` at `src` (any alignment) as F32 / F64.
template <class T>
void convert_span(const uint8_t* src, DType from, T* dst, int64_t n) {
  auto run = [&](auto load) {
#pragma omp parallel for schedule(static) if (n > (int64_t(1) << 16))
    for (int64_t i = 0; i < n; ++i) dst[i] = T(load(i));
  };
  switch (from) {
    case DType::F32:
      run([src](int64_t i) {
        float v;
        std::memcpy(&v, src + 4 * i, 4);
        return v;
      });
      break;
    case DType::F64:
      run([src](int64_t i) {
        double v;
        std::memcpy(&v, src + 8 * i, 8);
        return v;
      });
      break;
    case DType::BF16:
      run([src](int64_t i) {
        uint16_t v;
        std::memcpy(&v, src + 2 * i, 2);
        return bf16_to_f32(v);
      });
      break;
    case DType::F16:
      run([src](int64_t i) {
        uint16_t v;
        std::memcpy(&v, src + 2 * i, 2);
        return f16_to_f32(v);
      });
      break;
    default:
      throw Error(std::string("cannot convert ") + dtype_name(from));
  }
}

}  // namespace

Tensor SafetensorsFile::read(const std::string& name, DType dtype) const {
  const TensorInfo& i = info(name);
  FT_CHECK(is_floating(dtype) && is_floating(i.dtype),
           name_ + ": cannot read tensor '" + printable(name) + "' (" + dtype_name(i.dtype) +
               ") as " + dtype_name(dtype) + ": not both float types");
  const uint8_t* p = data_ + i.begin;
  Tensor t = Tensor::empty(i.shape, dtype);
  const int64_t n = t.numel();
  if (dtype == i.dtype) {
    // In 1 MiB pieces over the threads: the copy's cost is page faults (the mapped file's
    // and the new buffer's), which then happen in parallel.
    const size_t bytes = t.nbytes(), piece = size_t(1) << 20;
    const int64_t pieces = int64_t((bytes + piece - 1) / piece);
    auto* dst = static_cast<uint8_t*>(t.raw());
#pragma omp parallel for schedule(static) if (pieces > 1)
    for (int64_t k = 0; k < pieces; ++k)
      std::memcpy(dst + size_t(k) * piece, p + size_t(k) * piece,
                  std::min(piece, bytes - size_t(k) * piece));
  } else if (dtype == DType::F32) {
    convert_span(p, i.dtype, t.data<float>(), n);
  } else if (dtype == DType::F64) {
    convert_span(p, i.dtype, t.data<double>(), n);
  } else {
    // BF16 / F16 targets round the F32 value (F64 sources: as Tensor::to does).
    uint16_t* d = t.data<uint16_t>();
    const bool bf = dtype == DType::BF16;
    constexpr int64_t kBlock = 4096;
    const int64_t blocks = (n + kBlock - 1) / kBlock;
    const size_t es = dtype_size(i.dtype);
#pragma omp parallel for schedule(static) if (blocks > 1)
    for (int64_t b = 0; b < blocks; ++b) {
      float tmp[kBlock];
      const int64_t lo = b * kBlock, m = std::min(kBlock, n - lo);
      convert_span(p + size_t(lo) * es, i.dtype, tmp, m);
      for (int64_t k = 0; k < m; ++k) d[lo + k] = bf ? f32_to_bf16(tmp[k]) : f32_to_f16(tmp[k]);
    }
  }
  return t;
}

void SafetensorsFile::evict(const std::string& name) const {
  if (!map_begin_) return;
  const TensorInfo& i = info(name);
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(data_ + i.begin) + page - 1) / page * page;
  const uintptr_t hi = reinterpret_cast<uintptr_t>(data_ + i.end) / page * page;
  if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

namespace detail {

uint64_t write_safetensors(const fs::path& path, const NamedTensors& tensors,
                           const std::map<std::string, std::string>& metadata,
                           std::optional<DType> convert_to) {
  std::vector<TensorSource> sources;
  sources.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    FT_CHECK(t.defined(), path.string() + ": tensor '" + name + "' is undefined");
    sources.push_back({name, t.shape(), t.dtype(), [t = t] { return t; }});
  }
  return write_safetensors(path, sources, metadata, convert_to);
}

uint64_t write_safetensors(const fs::path& path, const std::vector<TensorSource>& tensors,
                           const std::map<std::string, std::string>& metadata,
                           std::optional<DType> convert_to) {
  const std::string file = path.string();
  auto out_dtype = [&](DType dt) { return convert_to && is_floating(dt) ? *convert_to : dt; };
  FT_CHECK(!convert_to || is_floating(*convert_to),
           file + ": cannot save tensors as " + dtype_name(*convert_to) + " (not a float type)");
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  uint64_t offset = 0;
  for (const auto& [name, shape, dtype, produce, keep_dtype] : tensors) {
    FT_CHECK(name != "__metadata__", file + ": '__metadata__' cannot name a tensor");
    FT_CHECK(!header.contains(name), file + ": tensor '" + name + "' given twice");
    const DType dt = keep_dtype ? dtype : out_dtype(dtype);
    const uint64_t bytes = uint64_t(shape_numel(shape)) * dtype_size(dt);
    header[name] = {
        {"dtype", dtype_name(dt)}, {"shape", shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h;
  try {
    h = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw Error(file + ": cannot encode header (" + e.what() + ")");
  }
  h.append((8 - h.size() % 8) % 8, ' ');  // data starts 8-byte aligned, like HF

  FileWriter w(path);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(h.size()) >> (8 * i));
  w.write(len, 8);
  w.write(h);
  for (const auto& src : tensors) {
    const Tensor t = src.produce();
    auto written = [&](DType d) { return src.keep_dtype ? d : out_dtype(d); };
    FT_CHECK(t.defined() && t.shape() == src.shape && written(t.dtype()) == written(src.dtype),
             file + ": tensor '" + src.name + "' was produced as " +
                 (t.defined() ? std::string(dtype_name(t.dtype())) + " " + shape_str(t.shape())
                              : std::string("nothing")) +
                 ", not the announced " + dtype_name(src.dtype) + " " + shape_str(src.shape));
    const DType dt = written(t.dtype());
    if (dt == t.dtype()) {
      if (t.nbytes()) w.write(t.raw(), t.nbytes());
    } else {
      Tensor c = t.to(dt);  // one tensor at a time: peak extra memory is one converted copy
      if (c.nbytes()) w.write(c.raw(), c.nbytes());
    }
  }
  w.close();
  return offset;
}

}  // namespace detail

void save_safetensors(const fs::path& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const fs::path tmp = unique_sibling(path, ".tmp");
  try {
    detail::write_safetensors(tmp, tensors, metadata, std::nullopt);
    FT_CHECK(
        ::rename(tmp.c_str(), path.c_str()) == 0,
        "cannot rename '" + tmp.string() + "' to '" + path.string() + "': " + std::strerror(errno));
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_directory(path.parent_path());
}

}  // namespace fusetune
