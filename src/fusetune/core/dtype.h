#pragma once
// Element types. Compute happens in F32 (training) or F64 (gradient checks). BF16 is also a
// training dtype, as storage only: a BF16 graph keeps its values in bf16 and its kernels
// compute in F32 (runtime/bf16_node_kernels.h). F16 appears only in checkpoints; I32 carries
// token ids, labels and positions.
#include <cstddef>
#include <cstdint>
#include <string>

namespace fusetune {

enum class DType : uint8_t { F32, F64, BF16, F16, I32, I64 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // safetensors spelling: "F32", "BF16", ...
bool dtype_from_name(const std::string& name, DType* out);
bool is_floating(DType t);  // F32, F64, BF16, F16
// The dtype kernels compute in for values stored as `storage`: F64 for F64, else F32.
DType compute_dtype(DType storage);

// bf16 / fp16 <-> fp32 conversions (round-to-nearest-even on the way down).
float bf16_to_f32(uint16_t v);
uint16_t f32_to_bf16(float v);
float f16_to_f32(uint16_t v);
uint16_t f32_to_f16(float v);
// n floating elements of dtype `from` at `src` (aligned for it) as F32 (F64 rounded to nearest).
void widen_to_f32(const void* src, DType from, int64_t n, float* out);

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::F32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::F64;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::I32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::I64;
}

}  // namespace fusetune
