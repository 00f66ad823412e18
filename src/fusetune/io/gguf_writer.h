#pragma once
// GGUF v3 files (ggml's model format, what llama.cpp loads): the magic "GGUF", version 3, the
// tensor and key-value counts, the metadata key-values, the tensor infos (name, dims innermost
// first, ggml type, offset), padding to general.alignment (32), then the tensor data, each
// tensor starting at a multiple of the alignment. Little-endian throughout.
//
// Tensor data is produced only when written (one tensor in memory at a time); the file is
// written next to the target and renamed over it, so a failed export leaves no partial file.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace fusetune::gguf {

inline constexpr uint32_t kAlignment = 32;

// ggml_type values (ggml.h) of the types we write.
enum class TensorType : uint32_t { F32 = 0, F16 = 1, Q4_0 = 2, Q8_0 = 8, Q6_K = 14 };
const char* type_name(TensorType t);
// Bytes of a row-major tensor of `numel` elements (rows whole blocks: 32 for Q4_0/Q8_0, 256
// for Q6_K).
uint64_t type_bytes(TensorType t, int64_t numel);

// gguf_type values of metadata.
enum class ValueType : uint32_t {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12
};

struct TensorEntry {
  std::string name;
  std::vector<int64_t> shape;  // row-major (PyTorch order); the file stores it reversed
  TensorType type;
  std::function<std::vector<uint8_t>()> produce;  // exactly type_bytes(type, numel) bytes
};

class Writer {
 public:
  void add_u32(const std::string& key, uint32_t v);
  void add_i32(const std::string& key, int32_t v);
  void add_f32(const std::string& key, float v);
  void add_bool(const std::string& key, bool v);
  void add_string(const std::string& key, const std::string& v);
  void add_strings(const std::string& key, const std::vector<std::string>& v);
  void add_f32s(const std::string& key, const std::vector<float>& v);
  void add_i32s(const std::string& key, const std::vector<int32_t>& v);
  void add_tensor(TensorEntry t);

  // Writes the file (general.alignment is added). Throws fusetune::Error naming the path.
  void write(const std::filesystem::path& path) const;

 private:
  struct KV {
    std::string key;
    ValueType type;
    std::vector<uint8_t> payload;  // the encoded value (after the type)
  };
  void add(const std::string& key, ValueType type, std::vector<uint8_t> payload);
  std::vector<KV> kvs_;
  std::vector<TensorEntry> tensors_;
};

}  // namespace fusetune::gguf
