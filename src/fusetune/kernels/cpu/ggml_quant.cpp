#include "fusetune/kernels/cpu/ggml_quant.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "fusetune/runtime/dtype.h"
#include "fusetune/util/error.h"

namespace fusetune::ggml {
namespace {

void check_k(int64_t k, const char* what) {
  FT_CHECK(k >= 0 && k % kBlock == 0, std::string(what) + ": row length " + std::to_string(k) +
                                          " is not a multiple of the block size 32");
}

// ggml's C cast (int8_t)v. For the finite values the quantizers produce it is the truncation;
// a non-finite v (a block so tiny that 1/d overflows: 0 * inf, x * inf) is undefined in C and
// gives 0 on x86 (cvttss2si's 0x80000000, low byte 0), which we return without the UB.
int to_int8(float v) { return std::isfinite(v) ? static_cast<int8_t>(v) : 0; }

}  // namespace

// The engine's IEEE half conversions (runtime/dtype.h) round to nearest even and map NaN to a
// quiet NaN, as ggml's software converter and x86's F16C do.
uint16_t fp32_to_fp16(float f) { return f32_to_f16(f); }
float fp16_to_fp32(uint16_t h) { return f16_to_f32(h); }

void quantize_row_q4_0(const float* x, BlockQ4_0* y, int64_t k) {
  check_k(k, "quantize_row_q4_0");
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const float* xb = x + b * kBlock;
    float amax = 0.0f, max = 0.0f;  // the signed value of largest magnitude, first on ties
    for (int64_t j = 0; j < kBlock; ++j) {
      if (amax < std::fabs(xb[j])) {
        amax = std::fabs(xb[j]);
        max = xb[j];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    for (int64_t j = 0; j < kBlock / 2; ++j) {
      // ggml truncates (x * id + 8.5) through int8_t: round half up, then caps at 15 (the
      // element equal to max maps to -8 + 8 = 0; its opposite would be 16).
      const int lo = std::min(15, to_int8(xb[j] * id + 8.5f));
      const int hi = std::min(15, to_int8(xb[j + kBlock / 2] * id + 8.5f));
      y[b].qs[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

void dequantize_row_q4_0(const BlockQ4_0* x, float* y, int64_t k) {
  check_k(k, "dequantize_row_q4_0");
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const float d = fp16_to_fp32(x[b].d);
    float* yb = y + b * kBlock;
    for (int64_t j = 0; j < kBlock / 2; ++j) {
      yb[j] = static_cast<float>((x[b].qs[j] & 0x0f) - 8) * d;
      yb[j + kBlock / 2] = static_cast<float>((x[b].qs[j] >> 4) - 8) * d;
    }
  }
}

void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t k) {
  check_k(k, "quantize_row_q8_0");
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const float* xb = x + b * kBlock;
    float amax = 0.0f;
    for (int64_t j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    for (int64_t j = 0; j < kBlock; ++j) {
      y[b].qs[j] = static_cast<int8_t>(to_int8(std::round(xb[j] * id)));  // roundf: ties away
    }
  }
}

void dequantize_row_q8_0(const BlockQ8_0* x, float* y, int64_t k) {
  check_k(k, "dequantize_row_q8_0");
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const float d = fp16_to_fp32(x[b].d);
    for (int64_t j = 0; j < kBlock; ++j) y[b * kBlock + j] = static_cast<float>(x[b].qs[j]) * d;
  }
}

// One block at a time so x == y works and no whole quantized copy is needed.
void fake_quantize_row_q4_0(const float* x, float* y, int64_t k) {
  check_k(k, "fake_quantize_row_q4_0");
  for (int64_t b = 0; b < k / kBlock; ++b) {
    BlockQ4_0 q;
    quantize_row_q4_0(x + b * kBlock, &q, kBlock);
    dequantize_row_q4_0(&q, y + b * kBlock, kBlock);
  }
}

void fake_quantize_row_q8_0(const float* x, float* y, int64_t k) {
  check_k(k, "fake_quantize_row_q8_0");
  for (int64_t b = 0; b < k / kBlock; ++b) {
    BlockQ8_0 q;
    quantize_row_q8_0(x + b * kBlock, &q, kBlock);
    dequantize_row_q8_0(&q, y + b * kBlock, kBlock);
  }
}

void fake_quantize_activations_q8_0(const float* x, float* y, int64_t k) {
  check_k(k, "fake_quantize_activations_q8_0");
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const float* xb = x + b * kBlock;
    float* yb = y + b * kBlock;
    float amax = 0.0f;
    for (int64_t j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = fp16_to_fp32(fp32_to_fp16(amax / 127.0f));
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int64_t j = 0; j < kBlock; ++j) {
      const float q = std::nearbyint(xb[j] * id);  // ties to even
      yb[j] = std::isfinite(q) ? q * d : 0.0f;     // 127/amax overflows only where d is 0
    }
  }
}

}  // namespace fusetune::ggml
