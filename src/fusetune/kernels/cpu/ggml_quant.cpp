#include "fusetune/kernels/cpu/ggml_quant.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
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

void check_k256(int64_t k, const char* what) {
  FT_CHECK(k >= 0 && k % kBlockK == 0, std::string(what) + ": row length " + std::to_string(k) +
                                           " is not a multiple of the super-block size 256");
}

// ggml's nearest_int: adding 1.5 * 2^23 leaves round-to-nearest-even(v) in the low mantissa
// bits (exact for |v| < 2^22; beyond that the same bits as ggml, whatever they mean).
int nearest_int(float v) {
  const float shifted = v + 12582912.0f;
  const auto bits = std::bit_cast<int32_t>(shifted);
  return (bits & 0x007fffff) - 0x00400000;
}

// The signed value of largest |x| (the first one on ties) and that magnitude.
void signed_max(const float* x, int64_t n, float& max, float& amax) {
  max = 0.0f;
  amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    if (a > amax) {
      amax = a;
      max = x[i];
    }
  }
}

constexpr float kGroupMaxEps = 1e-15f;  // ggml's GROUP_MAX_EPS

// ggml's make_qx_quants(16, 32, x, L, rmse_type 1, no importance weights): L[i] in 0..63 and the
// sub-block's scale, the best of 19 candidate inverse scales -(32 + 0.1 k) / max (k = -9..9) by
// the x^2-weighted least-squares fit. The float expressions keep ggml's operation order (the
// build does not contract them into FMAs).
float make_q6_sub_block(const float* x, int8_t* L) {
  constexpr int kN = 16, kNmax = 32;
  float max = 0.0f, amax = 0.0f;
  signed_max(x, kN, max, amax);
  if (amax < kGroupMaxEps) {
    std::memset(L, 0, kN);
    return 0.0f;
  }
  auto level = [](float iscale, float v) {
    return std::clamp(nearest_int(iscale * v), -kNmax, kNmax - 1);
  };
  float iscale = static_cast<float>(-kNmax) / max;
  float sumlx = 0.0f, suml2 = 0.0f;
  for (int i = 0; i < kN; ++i) {
    const int l = level(iscale, x[i]);
    L[i] = static_cast<int8_t>(l + kNmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * static_cast<float>(l);
    suml2 += w * static_cast<float>(l) * static_cast<float>(l);
  }
  float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int k = -9; k <= 9; ++k) {
    if (k == 0) continue;
    iscale = -(static_cast<float>(kNmax) + 0.1f * static_cast<float>(k)) / max;
    sumlx = suml2 = 0.0f;
    for (int i = 0; i < kN; ++i) {
      const float l = static_cast<float>(level(iscale, x[i]));
      const float w = x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0.0f && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < kN; ++i) L[i] = static_cast<int8_t>(kNmax + level(iscale, x[i]));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

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

void quantize_row_q6_K(const float* x, BlockQ6_K* y, int64_t k) {
  check_k256(k, "quantize_row_q6_K");
  for (int64_t b = 0; b < k / kBlockK; ++b) {
    const float* xb = x + b * kBlockK;
    BlockQ6_K& out = y[b];
    int8_t L[kBlockK];
    float scales[16];
    float max_scale = 0.0f, max_abs_scale = 0.0f;
    for (int s = 0; s < 16; ++s) {
      scales[s] = make_q6_sub_block(xb + 16 * s, L + 16 * s);
      if (std::fabs(scales[s]) > max_abs_scale) {
        max_abs_scale = std::fabs(scales[s]);
        max_scale = scales[s];
      }
    }
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(&out, 0, sizeof(out));
      continue;
    }
    const float iscale = -128.0f / max_scale;
    out.d = fp32_to_fp16(1.0f / iscale);
    for (int s = 0; s < 16; ++s)
      out.scales[s] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[s])));
    // Requantize against the stored scales. A sub-block whose int8 scale is 0 keeps the levels of
    // its own search (ggml stores them; they dequantize to 0).
    const float d_super = fp16_to_fp32(out.d);
    for (int s = 0; s < 16; ++s) {
      const float d = d_super * static_cast<float>(out.scales[s]);
      if (d == 0.0f) continue;
      for (int i = 0; i < 16; ++i)
        L[16 * s + i] =
            static_cast<int8_t>(std::clamp(nearest_int(xb[16 * s + i] / d), -32, 31) + 32);
    }
    // Packing: per half of 128, ql[l] holds elements l (low) and l + 64 (high), ql[l + 32]
    // elements l + 32 and l + 96; qh[l] the top 2 bits of l, l + 32, l + 64, l + 96.
    for (int h = 0; h < 2; ++h) {
      const int8_t* Lh = L + 128 * h;
      uint8_t* ql = out.ql + 64 * h;
      uint8_t* qh = out.qh + 32 * h;
      for (int l = 0; l < 32; ++l) {
        const int q0 = Lh[l], q1 = Lh[l + 32], q2 = Lh[l + 64], q3 = Lh[l + 96];
        ql[l] = static_cast<uint8_t>((q0 & 0xf) | ((q2 & 0xf) << 4));
        ql[l + 32] = static_cast<uint8_t>((q1 & 0xf) | ((q3 & 0xf) << 4));
        qh[l] = static_cast<uint8_t>((q0 >> 4) | ((q1 >> 4) << 2) | ((q2 >> 4) << 4) |
                                     ((q3 >> 4) << 6));
      }
    }
  }
}

void dequantize_row_q6_K(const BlockQ6_K* x, float* y, int64_t k) {
  check_k256(k, "dequantize_row_q6_K");
  for (int64_t b = 0; b < k / kBlockK; ++b) {
    const BlockQ6_K& in = x[b];
    const float d = fp16_to_fp32(in.d);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = in.ql + 64 * h;
      const uint8_t* qh = in.qh + 32 * h;
      const int8_t* sc = in.scales + 8 * h;
      float* yh = y + b * kBlockK + 128 * h;
      for (int l = 0; l < 32; ++l) {
        const int s = l / 16;
        const int q0 = ((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q1 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        // ggml: d * sc * q, left to right in float.
        yh[l] = d * static_cast<float>(sc[s]) * static_cast<float>(q0);
        yh[l + 32] = d * static_cast<float>(sc[s + 2]) * static_cast<float>(q1);
        yh[l + 64] = d * static_cast<float>(sc[s + 4]) * static_cast<float>(q2);
        yh[l + 96] = d * static_cast<float>(sc[s + 6]) * static_cast<float>(q3);
      }
    }
  }
}

void quantize_row_q8_K(const float* x, BlockQ8_K* y, int64_t k) {
  check_k256(k, "quantize_row_q8_K");
  for (int64_t b = 0; b < k / kBlockK; ++b) {
    const float* xb = x + b * kBlockK;
    BlockQ8_K& out = y[b];
    float max = 0.0f, amax = 0.0f;
    signed_max(xb, kBlockK, max, amax);
    if (amax == 0.0f) {
      std::memset(&out, 0, sizeof(out));
      continue;
    }
    const float iscale = -127.0f / max;
    for (int64_t j = 0; j < kBlockK; ++j)
      out.qs[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * xb[j])));
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += out.qs[16 * g + i];
      out.bsums[g] = static_cast<int16_t>(sum);
    }
    out.d = 1.0f / iscale;
  }
}

void dequantize_row_q8_K(const BlockQ8_K* x, float* y, int64_t k) {
  check_k256(k, "dequantize_row_q8_K");
  for (int64_t b = 0; b < k / kBlockK; ++b)
    for (int64_t j = 0; j < kBlockK; ++j)
      y[b * kBlockK + j] = x[b].d * static_cast<float>(x[b].qs[j]);
}

// One block at a time so x == y works and no whole quantized copy is needed.
template <class Block, int64_t kSize, class Quantize, class Dequantize>
void fake_quantize_blocks(const float* x, float* y, int64_t k, Quantize quantize,
                          Dequantize dequantize) {
  for (int64_t b = 0; b < k / kSize; ++b) {
    Block q;
    quantize(x + b * kSize, &q, kSize);
    dequantize(&q, y + b * kSize, kSize);
  }
}

void fake_quantize_row_q4_0(const float* x, float* y, int64_t k) {
  check_k(k, "fake_quantize_row_q4_0");
  fake_quantize_blocks<BlockQ4_0, kBlock>(x, y, k, quantize_row_q4_0, dequantize_row_q4_0);
}

void fake_quantize_row_q8_0(const float* x, float* y, int64_t k) {
  check_k(k, "fake_quantize_row_q8_0");
  fake_quantize_blocks<BlockQ8_0, kBlock>(x, y, k, quantize_row_q8_0, dequantize_row_q8_0);
}

void fake_quantize_row_q6_K(const float* x, float* y, int64_t k) {
  check_k256(k, "fake_quantize_row_q6_K");
  fake_quantize_blocks<BlockQ6_K, kBlockK>(x, y, k, quantize_row_q6_K, dequantize_row_q6_K);
}

void fake_quantize_row_q8_K(const float* x, float* y, int64_t k) {
  check_k256(k, "fake_quantize_row_q8_K");
  fake_quantize_blocks<BlockQ8_K, kBlockK>(x, y, k, quantize_row_q8_K, dequantize_row_q8_K);
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
