#pragma once
// llama.cpp's (ggml's) Q4_0 and Q8_0 block formats and its reference quantizers, byte for byte:
// what `fusetune export --format gguf` writes and what QAT's gguf_q4_0 / gguf_q8_0 fake
// quantization simulates.
//
// Q4_0 (ggml quantize_row_q4_0_ref): blocks of 32; m = the element of largest |x| (the first
// one on ties), d = m / -8, each q = min(15, trunc(x / d + 8.5)) in 0..15, value = (q - 8) * d.
// The scale is stored as IEEE fp16; dequantization uses the fp16 value, while quantization
// divides by the fp32 d (as ggml does). Nibble j holds element j (low) and j + 16 (high).
// Q8_0 (ggml quantize_row_q8_0_ref): d = amax / 127, q = roundf(x / d) (ties away from zero).
// fp16 conversion: round to nearest even (runtime/dtype.h), as ggml's software converter and
// x86 F16C do.
#include <cstdint>

namespace fusetune::ggml {

constexpr int64_t kBlock = 32;  // QK4_0 == QK8_0 == 32

struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[16];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};
static_assert(sizeof(BlockQ4_0) == 18, "block_q4_0 is 18 bytes");
static_assert(sizeof(BlockQ8_0) == 34, "block_q8_0 is 34 bytes");

uint16_t fp32_to_fp16(float f);
float fp16_to_fp32(uint16_t h);

// k % 32 == 0 (throws otherwise).
void quantize_row_q4_0(const float* x, BlockQ4_0* y, int64_t k);
void dequantize_row_q4_0(const BlockQ4_0* x, float* y, int64_t k);
void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t k);
void dequantize_row_q8_0(const BlockQ8_0* x, float* y, int64_t k);

// Fake quantization: y = dequantize(quantize(x)); x == y (in place) is allowed.
void fake_quantize_row_q4_0(const float* x, float* y, int64_t k);
void fake_quantize_row_q8_0(const float* x, float* y, int64_t k);

// What llama.cpp's CPU matmul does to an activation row before the dot products with Q4_0/Q8_0
// weights (ggml-cpu's SIMD quantize_row_q8_0 on x86 and ARM, not the reference above): d =
// amax / 127 stored as fp16, q = round-half-to-even(x * (127 / amax)); y = q * fp16(d).
void fake_quantize_activations_q8_0(const float* x, float* y, int64_t k);

}  // namespace fusetune::ggml
