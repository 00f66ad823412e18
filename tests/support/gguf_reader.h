#pragma once
// A minimal GGUF v3 reader written from the format description (not from the writer), for
// tests: metadata values as JSON, tensor infos, and each tensor's bytes.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fusetune::testing {

struct GGUFTensorInfo {
  std::string name;
  std::vector<uint64_t> ne;  // innermost first
  uint32_t type = 0;
  uint64_t offset = 0;
};

// Bytes of a tensor of ggml type `type` (ggml.h's type ids and block layouts: F32, F16, Q4_0 =
// 18 bytes per 32, Q8_0 = 34 per 32, Q6_K = 210 per 256); throws for other types or rows that
// are not whole blocks.
inline uint64_t ggml_tensor_bytes(uint32_t type, const std::vector<uint64_t>& ne) {
  uint64_t block = 1, block_bytes = 0;
  switch (type) {
    case 0:
      block_bytes = 4;
      break;
    case 1:
      block_bytes = 2;
      break;
    case 2:
      block = 32, block_bytes = 18;
      break;
    case 8:
      block = 32, block_bytes = 34;
      break;
    case 14:
      block = 256, block_bytes = 210;
      break;
    default:
      throw std::runtime_error("GGUF: tensor type " + std::to_string(type) + " not read");
  }
  if (ne.empty() || ne[0] % block != 0) throw std::runtime_error("GGUF: rows not whole blocks");
  uint64_t n = 1;
  for (uint64_t d : ne) n *= d;
  return n / block * block_bytes;
}

struct GGUFFile {
  uint32_t version = 0;
  std::map<std::string, nlohmann::json> kv;
  std::map<std::string, uint32_t> kv_type;
  std::vector<GGUFTensorInfo> tensors;
  uint64_t data_start = 0;
  std::vector<uint8_t> bytes;

  const GGUFTensorInfo& tensor(const std::string& name) const {
    for (const auto& t : tensors)
      if (t.name == name) return t;
    throw std::runtime_error("no tensor " + name);
  }
  bool has_tensor(const std::string& name) const {
    for (const auto& t : tensors)
      if (t.name == name) return true;
    return false;
  }
  const uint8_t* data(const std::string& name) const {
    return bytes.data() + data_start + tensor(name).offset;
  }
};

inline GGUFFile read_gguf(const std::filesystem::path& path) {
  GGUFFile f;
  std::ifstream in(path, std::ios::binary);
  f.bytes.assign(std::istreambuf_iterator<char>(in), {});
  size_t pos = 0;
  auto take = [&](void* dst, size_t n) {
    if (pos + n > f.bytes.size()) throw std::runtime_error("GGUF truncated");
    std::memcpy(dst, f.bytes.data() + pos, n);
    pos += n;
  };
  auto u32 = [&] {
    uint32_t v;
    take(&v, 4);
    return v;
  };
  auto u64 = [&] {
    uint64_t v;
    take(&v, 8);
    return v;
  };
  auto str = [&] {
    std::string s(u64(), '\0');
    take(s.data(), s.size());
    return s;
  };
  std::function<nlohmann::json(uint32_t)> value = [&](uint32_t type) -> nlohmann::json {
    switch (type) {
      case 0: {
        uint8_t v;
        take(&v, 1);
        return v;
      }
      case 1: {
        int8_t v;
        take(&v, 1);
        return v;
      }
      case 2: {
        uint16_t v;
        take(&v, 2);
        return v;
      }
      case 3: {
        int16_t v;
        take(&v, 2);
        return v;
      }
      case 4:
        return u32();
      case 5: {
        int32_t v;
        take(&v, 4);
        return v;
      }
      case 6: {
        float v;
        take(&v, 4);
        return v;
      }
      case 7: {
        uint8_t v;
        take(&v, 1);
        return v != 0;
      }
      case 8:
        return str();
      case 9: {
        const uint32_t et = u32();
        const uint64_t n = u64();
        nlohmann::json a = nlohmann::json::array();
        for (uint64_t i = 0; i < n; ++i) a.push_back(value(et));
        return a;
      }
      case 10:
        return u64();
      case 11: {
        int64_t v;
        take(&v, 8);
        return v;
      }
      case 12: {
        double v;
        take(&v, 8);
        return v;
      }
    }
    throw std::runtime_error("GGUF: bad value type " + std::to_string(type));
  };
  if (u32() != 0x46554747u) throw std::runtime_error("not a GGUF file");
  f.version = u32();
  const uint64_t n_tensors = u64(), n_kv = u64();
  for (uint64_t i = 0; i < n_kv; ++i) {
    const std::string key = str();
    const uint32_t type = u32();
    f.kv_type[key] = type;
    f.kv[key] = value(type);
  }
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GGUFTensorInfo t;
    t.name = str();
    const uint32_t nd = u32();
    for (uint32_t d = 0; d < nd; ++d) t.ne.push_back(u64());
    t.type = u32();
    t.offset = u64();
    f.tensors.push_back(t);
  }
  const uint64_t align =
      f.kv.count("general.alignment") ? f.kv["general.alignment"].get<uint64_t>() : 32;
  f.data_start = (pos + align - 1) / align * align;
  for (const auto& t : f.tensors)
    if (f.data_start + t.offset + ggml_tensor_bytes(t.type, t.ne) > f.bytes.size())
      throw std::runtime_error("GGUF: tensor " + t.name + " runs past the end of the file");
  return f;
}

}  // namespace fusetune::testing
