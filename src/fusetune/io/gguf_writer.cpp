#include "fusetune/io/gguf_writer.h"

#include <unistd.h>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "fusetune/util/error.h"
#include "fusetune/util/fs.h"

namespace fusetune::gguf {
namespace {

template <class T>
void put(std::vector<uint8_t>& out, T v) {  // little-endian hosts only (x86-64, aarch64)
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

void put_string(std::vector<uint8_t>& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  const size_t at = out.size();
  out.resize(at + s.size());
  if (!s.empty()) std::memcpy(out.data() + at, s.data(), s.size());
}

uint64_t pad(uint64_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }

}  // namespace

const char* type_name(TensorType t) {
  switch (t) {
    case TensorType::F32:
      return "F32";
    case TensorType::F16:
      return "F16";
    case TensorType::Q4_0:
      return "Q4_0";
    case TensorType::Q8_0:
      return "Q8_0";
    case TensorType::Q6_K:
      return "Q6_K";
  }
  return "?";
}

uint64_t type_bytes(TensorType t, int64_t numel) {
  const auto n = static_cast<uint64_t>(numel);
  switch (t) {
    case TensorType::F32:
      return n * 4;
    case TensorType::F16:
      return n * 2;
    case TensorType::Q4_0:
      return n / 32 * 18;
    case TensorType::Q8_0:
      return n / 32 * 34;
    case TensorType::Q6_K:
      return n / 256 * 210;
  }
  return 0;
}

void Writer::add(const std::string& key, ValueType type, std::vector<uint8_t> payload) {
  for (const auto& kv : kvs_) FT_CHECK(kv.key != key, "GGUF: duplicate metadata key " + key);
  kvs_.push_back({key, type, std::move(payload)});
}

void Writer::add_u32(const std::string& key, uint32_t v) {
  std::vector<uint8_t> p;
  put(p, v);
  add(key, ValueType::UINT32, std::move(p));
}
void Writer::add_i32(const std::string& key, int32_t v) {
  std::vector<uint8_t> p;
  put(p, v);
  add(key, ValueType::INT32, std::move(p));
}
void Writer::add_f32(const std::string& key, float v) {
  std::vector<uint8_t> p;
  put(p, v);
  add(key, ValueType::FLOAT32, std::move(p));
}
void Writer::add_bool(const std::string& key, bool v) {
  std::vector<uint8_t> p;
  put<uint8_t>(p, v ? 1 : 0);
  add(key, ValueType::BOOL, std::move(p));
}
void Writer::add_string(const std::string& key, const std::string& v) {
  std::vector<uint8_t> p;
  put_string(p, v);
  add(key, ValueType::STRING, std::move(p));
}
void Writer::add_strings(const std::string& key, const std::vector<std::string>& v) {
  std::vector<uint8_t> p;
  put(p, static_cast<uint32_t>(ValueType::STRING));
  put<uint64_t>(p, v.size());
  for (const auto& s : v) put_string(p, s);
  add(key, ValueType::ARRAY, std::move(p));
}
void Writer::add_f32s(const std::string& key, const std::vector<float>& v) {
  std::vector<uint8_t> p;
  put(p, static_cast<uint32_t>(ValueType::FLOAT32));
  put<uint64_t>(p, v.size());
  for (float x : v) put(p, x);
  add(key, ValueType::ARRAY, std::move(p));
}
void Writer::add_i32s(const std::string& key, const std::vector<int32_t>& v) {
  std::vector<uint8_t> p;
  put(p, static_cast<uint32_t>(ValueType::INT32));
  put<uint64_t>(p, v.size());
  for (int32_t x : v) put(p, x);
  add(key, ValueType::ARRAY, std::move(p));
}

void Writer::add_tensor(TensorEntry t) {
  for (const auto& e : tensors_) FT_CHECK(e.name != t.name, "GGUF: duplicate tensor " + t.name);
  FT_CHECK(!t.shape.empty() && t.shape.size() <= 4,
           "GGUF: tensor " + t.name + " must have 1 to 4 dimensions");
  const int64_t block = t.type == TensorType::Q6_K                                 ? 256
                        : t.type == TensorType::Q4_0 || t.type == TensorType::Q8_0 ? 32
                                                                                   : 1;
  FT_CHECK(t.shape.back() % block == 0,
           "GGUF: tensor " + t.name + " has rows of " + std::to_string(t.shape.back()) +
               " elements; " + type_name(t.type) + " needs a multiple of " + std::to_string(block));
  tensors_.push_back(std::move(t));
}

void Writer::write(const std::filesystem::path& path) const {
  std::vector<uint8_t> head;
  put<uint32_t>(head, 0x46554747u);  // "GGUF"
  put<uint32_t>(head, 3);
  put<uint64_t>(head, tensors_.size());
  put<uint64_t>(head, kvs_.size() + 1);
  put_string(head, "general.alignment");
  put(head, static_cast<uint32_t>(ValueType::UINT32));
  put<uint32_t>(head, kAlignment);
  for (const auto& kv : kvs_) {
    put_string(head, kv.key);
    put(head, static_cast<uint32_t>(kv.type));
    head.insert(head.end(), kv.payload.begin(), kv.payload.end());
  }
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    put_string(head, t.name);
    put<uint32_t>(head, static_cast<uint32_t>(t.shape.size()));
    int64_t numel = 1;
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) {  // ne[0] is the innermost
      put<uint64_t>(head, static_cast<uint64_t>(*it));
      numel *= *it;
    }
    put(head, static_cast<uint32_t>(t.type));
    put<uint64_t>(head, offset);
    offset = pad(offset + type_bytes(t.type, numel));
  }
  head.resize(pad(head.size()), 0);

  const std::filesystem::path tmp = unique_sibling(path, ".tmp");
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  FT_CHECK(f, "cannot write '" + tmp.string() + "': " + std::strerror(errno));
  bool ok = true;
  try {
    ok = std::fwrite(head.data(), 1, head.size(), f) == head.size();
    for (const auto& t : tensors_) {
      if (!ok) break;
      int64_t numel = 1;
      for (int64_t d : t.shape) numel *= d;
      std::vector<uint8_t> data = t.produce();
      FT_CHECK(data.size() == type_bytes(t.type, numel),
               "GGUF: tensor " + t.name + " produced " + std::to_string(data.size()) +
                   " bytes, expected " + std::to_string(type_bytes(t.type, numel)));
      data.resize(pad(data.size()), 0);
      ok = std::fwrite(data.data(), 1, data.size(), f) == data.size();
    }
    ok = std::fflush(f) == 0 && ok;
  } catch (...) {
    std::fclose(f);
    ::unlink(tmp.c_str());
    throw;
  }
  ok = std::fclose(f) == 0 && ok;
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw Error("cannot write '" + path.string() + "': " + why);
  }
}

}  // namespace fusetune::gguf
