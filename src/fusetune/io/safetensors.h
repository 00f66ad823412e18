#pragma once
// safetensors files (the Hugging Face format): an 8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then the raw data.
// Reading mmaps the file and validates the header as strictly as the reference
// implementation (tensors tile the data section exactly, no gaps, no overlaps), so that a
// truncated or corrupt file fails at open with a one-line error naming file and tensor.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fusetune/core/tensor.h"

namespace fusetune {

struct TensorInfo {
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0;  // byte offsets within the data section
  uint64_t end = 0;
};

class SafetensorsFile {
 public:
  // mmaps `path` and validates it. The file is opened read-only; the mapping is private
  // copy-on-write, so writing into a borrowed tensor never changes the file.
  static SafetensorsFile open(const std::filesystem::path& path);
  // Parses bytes already in memory (kept alive by `owner`); `name` is used in errors.
  static SafetensorsFile from_memory(const void* data, size_t size,
                                     std::shared_ptr<const void> owner, std::string name);

  const std::string& path() const { return name_; }
  const std::vector<std::string>& names() const { return names_; }  // in header order
  bool has(const std::string& name) const { return infos_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;
  // A tensor over the file's bytes (no copy) that keeps the mapping alive. When the bytes are
  // not aligned for the dtype (other writers may not pad the header), an aligned copy.
  Tensor tensor(const std::string& name) const;
  // An owned, counted copy of a floating tensor converted to `dtype` (a float type) straight
  // from the file's bytes: no intermediate copy, whatever the two dtypes.
  Tensor read(const std::string& name, DType dtype) const;
  // Drops the pages of a mmap'd file that hold only `name`'s bytes from memory (they are read
  // from the file again when touched): for loaders that have copied the tensor out. Writes to
  // borrowed tensors over those bytes are lost. No-op for files not opened by open().
  void evict(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  std::string name_;
  std::shared_ptr<const void> owner_;
  const uint8_t* data_ = nullptr;       // start of the data section
  bool writable_ = false;               // private mapping: borrowed tensors may be written
  const uint8_t* map_begin_ = nullptr;  // the whole mapping, when open() made it
  size_t map_size_ = 0;
  std::vector<std::string> names_;
  std::map<std::string, TensorInfo> infos_;
  std::map<std::string, std::string> metadata_;
};

// `s` with control characters escaped (\x0a), so names read from a file keep errors one line.
std::string printable(std::string_view s);

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Writes a safetensors file atomically (temp file + rename), tensors in the given order.
// Like Hugging Face's writer: header padded with spaces so the data starts 8-byte aligned,
// tensors packed back to back (no gaps, which the reference reader rejects).
void save_safetensors(const std::filesystem::path& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// A tensor a writer asks for only when it reaches it, so that a whole model never has to sit
// in memory: `produce` returns a tensor of `shape` (any float dtype when the writer converts,
// else `dtype`).
struct TensorSource {
  std::string name;
  Shape shape;
  DType dtype = DType::F32;
  std::function<Tensor()> produce;
  // Written in `dtype` as produced, whatever the writer converts the others to (a multimodal
  // checkpoint's vision tensors, carried through unchanged).
  bool keep_dtype = false;
};

namespace detail {
// The same, for tensors produced one at a time.
uint64_t write_safetensors(const std::filesystem::path& path,
                           const std::vector<TensorSource>& tensors,
                           const std::map<std::string, std::string>& metadata,
                           std::optional<DType> convert_to);
// Writes a safetensors file at `path` (which must not exist) and fsyncs it, converting each
// floating tensor to `convert_to` when given, one tensor at a time. Not atomic by itself.
// Returns the number of data bytes written.
uint64_t write_safetensors(const std::filesystem::path& path, const NamedTensors& tensors,
                           const std::map<std::string, std::string>& metadata,
                           std::optional<DType> convert_to);
}  // namespace detail

}  // namespace fusetune
