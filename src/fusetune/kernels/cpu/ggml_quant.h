#pragma once
// llama.cpp's (ggml's) Q4_0, Q8_0 and Q6_K block formats and its reference quantizers, byte for
// byte: what `fusetune export --format gguf` writes and what QAT's gguf_q4_0 / gguf_q8_0 fake
// quantization simulates; and Q8_K, what llama.cpp's CPU matmul quantizes a Q6_K weight's
// activations to.
//
// Q4_0 (ggml quantize_row_q4_0_ref): blocks of 32; m = the element of largest |x| (the first
// one on ties), d = m / -8, each q = min(15, trunc(x / d + 8.5)) in 0..15, value = (q - 8) * d.
// The scale is stored as IEEE fp16; dequantization uses the fp16 value, while quantization
// divides by the fp32 d (as ggml does). Nibble j holds element j (low) and j + 16 (high).
// Q8_0 (ggml quantize_row_q8_0_ref): d = amax / 127, q = roundf(x / d) (ties away from zero).
// fp16 conversion: round to nearest even (core/dtype.h), as ggml's software converter and
// x86 F16C do.
// Q6_K (ggml quantize_row_q6_K_ref): super-blocks of 256 = 16 sub-blocks of 16. Each sub-block
// gets a scale from ggml's make_qx_quants search (nmax 32, weights x^2, 19 candidate inverse
// scales); the 16 scales are quantized to int8 against the largest-magnitude one (d = its
// scale / -128, fp16), then each value to 6 bits (-32..31) against fp16(d) * int8 scale.
// Rounding is ggml's nearest_int (the 1.5 * 2^23 addition trick: ties to even).
// Q8_K (ggml quantize_row_q8_K_ref, which x86's and ARM's CPU backends call as is): blocks of
// 256, fp32 d = max / -127 (the signed value of largest |x|), q = min(127, nearest_int(x / d)).
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

constexpr int64_t kBlockK = 256;  // QK_K: the super-block of the K-quants and Q8_K

struct BlockQ6_K {
  uint8_t ql[128];    // low 4 bits of the 6-bit quants
  uint8_t qh[64];     // high 2 bits
  int8_t scales[16];  // one per sub-block of 16
  uint16_t d;         // fp16 super-block scale
};
struct BlockQ8_K {
  float d;
  int8_t qs[256];
  int16_t bsums[16];  // sums of qs per group of 16 (the K-quant dot products use them)
};
static_assert(sizeof(BlockQ6_K) == 210, "block_q6_K is 210 bytes");

// A Q6_K block's scales alone: the part of quantize_row_q6_K that costs (the make_qx_quants
// search, 19 candidate scales per sub-block). With them, fake_quantize_row_q6_K_scaled forms
// fake_quantize_row_q6_K's values bit for bit in one cheap rounding pass, so a weight
// fake-quantized many times over (the fused LM head's tiles, twice per chunk of tokens)
// searches once: 18 bytes per 256 weights.
struct Q6_KScales {
  int8_t scales[16];
  uint16_t d;
};
static_assert(sizeof(Q6_KScales) == 18, "the scales of one Q6_K block");
static_assert(sizeof(BlockQ8_K) == 292, "block_q8_K is 292 bytes");

uint16_t fp32_to_fp16(float f);
float fp16_to_fp32(uint16_t h);

// k % 32 == 0 (throws otherwise).
void quantize_row_q4_0(const float* x, BlockQ4_0* y, int64_t k);
void dequantize_row_q4_0(const BlockQ4_0* x, float* y, int64_t k);
void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t k);
void dequantize_row_q8_0(const BlockQ8_0* x, float* y, int64_t k);
// k % 256 == 0 (throws otherwise).
void quantize_row_q6_K(const float* x, BlockQ6_K* y, int64_t k);
void dequantize_row_q6_K(const BlockQ6_K* x, float* y, int64_t k);
void quantize_row_q8_K(const float* x, BlockQ8_K* y, int64_t k);
void dequantize_row_q8_K(const BlockQ8_K* x, float* y, int64_t k);

// Fake quantization: y = dequantize(quantize(x)); x == y (in place) is allowed.
void fake_quantize_row_q4_0(const float* x, float* y, int64_t k);
void fake_quantize_row_q8_0(const float* x, float* y, int64_t k);
void fake_quantize_row_q6_K(const float* x, float* y, int64_t k);
void q6_K_scales(const float* x, Q6_KScales* y, int64_t k);
// The same values as fake_quantize_row_q6_K(x), given q6_K_scales(x).
void fake_quantize_row_q6_K_scaled(const float* x, const Q6_KScales* scales, float* y, int64_t k);
// Q8_K: also what llama.cpp's CPU matmul does to the activations of a Q6_K weight.
void fake_quantize_row_q8_K(const float* x, float* y, int64_t k);

// What llama.cpp's CPU matmul does to an activation row before the dot products with Q4_0/Q8_0
// weights (ggml-cpu's SIMD quantize_row_q8_0 on x86 and ARM, not the reference above): d =
// amax / 127 stored as fp16, q = round-half-to-even(x * (127 / amax)); y = q * fp16(d).
void fake_quantize_activations_q8_0(const float* x, float* y, int64_t k);

}  // namespace fusetune::ggml
