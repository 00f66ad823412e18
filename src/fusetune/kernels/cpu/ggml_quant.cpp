#include "fusetune/kernels/cpu/ggml_quant.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>

#include "fusetune/core/dtype.h"
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

// 8 lanes of float and int32 (GCC/Clang vector extensions): the Q6_K scale search runs on 8
// sub-blocks at once, and the fake quantizers on 8 elements. Each lane does exactly the scalar
// float operations of ggml's code, in the same order (the build does not contract them into
// FMAs), so every lane is bit for bit the scalar result; only selections are written as masks.
// They stay inside this file (anonymous namespace), so GCC's note that passing them by value has
// another ABI without AVX (the sanitizer preset builds without -march=native) does not apply.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
using F8 = float __attribute__((vector_size(32)));
using I8 = int32_t __attribute__((vector_size(32)));

F8 select(I8 mask, F8 a, F8 b) {  // mask lanes are -1 (take a) or 0 (take b)
  return std::bit_cast<F8>((mask & std::bit_cast<I8>(a)) | (~mask & std::bit_cast<I8>(b)));
}
I8 select(I8 mask, I8 a, I8 b) { return (mask & a) | (~mask & b); }

I8 nearest_int(F8 v) {  // ggml's nearest_int, lane by lane
  return (std::bit_cast<I8>(v + 12582912.0f) & 0x007fffff) - 0x00400000;
}

F8 load8(const float* p) {
  F8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
void store8(float* p, F8 v) { std::memcpy(p, &v, sizeof(v)); }
F8 abs8(F8 v) { return std::bit_cast<F8>(std::bit_cast<I8>(v) & 0x7fffffff); }

// v where finite, else 0: a non-finite x * id (a block so tiny that 1/d overflows) gets level 0
// as to_int8 gives it, and converting it to an integer would be undefined.
F8 finite_or_zero(F8 v) { return select(abs8(v) <= FLT_MAX, v, F8{}); }  // false for NaN

// max |x| over a block of 32 (NaN ignored, as the scalar comparisons ignore it).
float block_amax(const float* x) {
  F8 m = F8{};
  for (int64_t j = 0; j < kBlock; j += 8) {
    const F8 a = abs8(load8(x + j));
    m = select(a > m, a, m);
  }
  float amax = 0.0f;
  for (int j = 0; j < 8; ++j) amax = std::max(amax, m[j]);
  return amax;
}

// ggml's make_qx_quants(16, 32, x, L, rmse_type 1, no importance weights) on 8 sub-blocks of 16:
// each sub-block's scale (the best of 19 candidate inverse scales -(32 + 0.1 k) / max, k =
// -9..9, by the x^2-weighted least-squares fit), the inverse scale its levels L = 32 +
// clamp(nearest_int(iscale x), -32, 31) come from, and whether it is all ~0 (ggml: L = 0,
// scale 0).
struct SubBlockSearch {
  float scale[16], iscale[16];
  bool tiny[16];
};

void search_8_sub_blocks(const float* x, float* scale_out, float* iscale_out, bool* tiny_out) {
  constexpr int kN = 16, kNmax = 32;
  F8 xs[kN];  // xs[i] lane j = element i of sub-block j
  for (int i = 0; i < kN; ++i)
    for (int j = 0; j < 8; ++j) xs[i][j] = x[kN * j + i];
  F8 max = {}, amax = {};  // the signed value of largest |x|, the first one on ties
  for (int i = 0; i < kN; ++i) {
    const F8 a = abs8(xs[i]);
    const I8 larger = a > amax;
    amax = select(larger, a, amax);
    max = select(larger, xs[i], max);
  }
  // Sums of w x l and w l^2 (w = x^2) for the levels of one inverse scale.
  auto fit = [&](F8 iscale, F8& sumlx, F8& suml2) {
    sumlx = F8{};
    suml2 = F8{};
    for (int i = 0; i < kN; ++i) {
      I8 l = nearest_int(iscale * xs[i]);
      l = select(l < -kNmax, I8{} - kNmax, l);
      l = select(l > kNmax - 1, I8{} + (kNmax - 1), l);
      const F8 lf = __builtin_convertvector(l, F8);
      const F8 w = xs[i] * xs[i];
      sumlx += w * xs[i] * lf;
      suml2 += w * lf * lf;
    }
  };
  F8 best_iscale = static_cast<float>(-kNmax) / max;
  F8 sumlx, suml2;
  fit(best_iscale, sumlx, suml2);
  F8 scale = select(suml2 != 0.0f, sumlx / suml2, F8{});
  F8 best = scale * sumlx;
  for (int k = -9; k <= 9; ++k) {
    if (k == 0) continue;
    const F8 iscale = -(static_cast<float>(kNmax) + 0.1f * static_cast<float>(k)) / max;
    fit(iscale, sumlx, suml2);
    const I8 better = (suml2 > 0.0f) & (sumlx * sumlx > best * suml2);
    scale = select(better, sumlx / suml2, scale);
    best = select(better, scale * sumlx, best);
    best_iscale = select(better, iscale, best_iscale);
  }
  for (int j = 0; j < 8; ++j) {
    tiny_out[j] = amax[j] < kGroupMaxEps;
    scale_out[j] = tiny_out[j] ? 0.0f : scale[j];
    iscale_out[j] = best_iscale[j];
  }
}

SubBlockSearch search_sub_blocks(const float* xb) {
  SubBlockSearch r;
  search_8_sub_blocks(xb, r.scale, r.iscale, r.tiny);
  search_8_sub_blocks(xb + 128, r.scale + 8, r.iscale + 8, r.tiny + 8);
  return r;
}

// The stored part of a Q6_K block besides its 6-bit values, from the search: the sub-block
// scales quantized to int8 against the largest-magnitude one (d = its scale / -128, fp16).
// Returns false for a block whose scales are all ~0 (ggml zeroes the whole block).
bool block_scales(const SubBlockSearch& r, Q6_KScales& out) {
  float max_scale = 0.0f, max_abs_scale = 0.0f;
  signed_max(r.scale, 16, max_scale, max_abs_scale);
  if (max_abs_scale < kGroupMaxEps) {
    std::memset(&out, 0, sizeof(out));
    return false;
  }
  const float iscale = -128.0f / max_scale;
  out.d = fp32_to_fp16(1.0f / iscale);
  for (int s = 0; s < 16; ++s)
    out.scales[s] = static_cast<int8_t>(std::min(127, nearest_int(iscale * r.scale[s])));
  return true;
}

}  // namespace

// The engine's IEEE half conversions (core/dtype.h) round to nearest even and map NaN to a
// quiet NaN, as ggml's software converter and x86's F16C do.
uint16_t fp32_to_fp16(float f) { return f32_to_f16(f); }
float fp16_to_fp32(uint16_t h) { return f16_to_f32(h); }

void quantize_row_q4_0(const float* x, BlockQ4_0* y, int64_t k) {
  check_k(k, "quantize_row_q4_0");
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const float* xb = x + b * kBlock;
    float amax = 0.0f, max = 0.0f;  // the signed value of largest magnitude, first on ties
    signed_max(xb, kBlock, max, amax);
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
    const SubBlockSearch search = search_sub_blocks(xb);
    Q6_KScales scales;
    if (!block_scales(search, scales)) {
      std::memset(&out, 0, sizeof(out));
      continue;
    }
    out.d = scales.d;
    std::memcpy(out.scales, scales.scales, sizeof(out.scales));
    // Levels against the stored scales. A sub-block whose int8 scale is 0 keeps the levels of
    // its own search (ggml stores them; they dequantize to 0).
    int8_t L[kBlockK];
    const float d_super = fp16_to_fp32(out.d);
    for (int s = 0; s < 16; ++s) {
      const float d = d_super * static_cast<float>(out.scales[s]);
      for (int i = 0; i < 16; ++i) {
        const float v = xb[16 * s + i];
        const int l = d != 0.0f        ? nearest_int(v / d)
                      : search.tiny[s] ? -32
                                       : nearest_int(search.iscale[s] * v);
        L[16 * s + i] = static_cast<int8_t>(std::clamp(l, -32, 31) + 32);
      }
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

// Q4_0 and Q8_0 fake quantization straight to the dequantized values, 8 elements at a time
// (QAT forms every weight tile this way, the LM head twice per chunk of tokens). Bit for bit
// quantize then dequantize: the same scale and fp16 rounding, integer levels (so a level 0 is
// +0), roundf as truncation plus one away from zero when the cut-off part is at least a half
// (exact: v - trunc(v) is exact in float).
void fake_quantize_row_q4_0(const float* x, float* y, int64_t k) {
  check_k(k, "fake_quantize_row_q4_0");
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const float* xb = x + b * kBlock;
    float* yb = y + b * kBlock;
    // The signed value of largest |x|, the first one on ties (0 for an all-zero block).
    const float amax = block_amax(xb);
    float max = 0.0f;
    for (int64_t j = 0; amax > 0.0f; ++j)
      if (std::fabs(xb[j]) == amax) {
        max = xb[j];
        break;
      }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const float dh = fp16_to_fp32(fp32_to_fp16(d));
    for (int64_t j = 0; j < kBlock; j += 8) {
      I8 q = __builtin_convertvector(finite_or_zero(load8(xb + j) * id + 8.5f), I8);  // trunc
      q = select(q > 15, I8{} + 15, q);
      store8(yb + j, __builtin_convertvector(q - 8, F8) * dh);
    }
  }
}

void fake_quantize_row_q8_0(const float* x, float* y, int64_t k) {
  check_k(k, "fake_quantize_row_q8_0");
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const float* xb = x + b * kBlock;
    float* yb = y + b * kBlock;
    const float d = block_amax(xb) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const float dh = fp16_to_fp32(fp32_to_fp16(d));
    for (int64_t j = 0; j < kBlock; j += 8) {
      const F8 v = finite_or_zero(load8(xb + j) * id);
      const I8 t = __builtin_convertvector(v, I8);  // trunc
      // roundf: one away from zero when the cut-off part is at least a half.
      const I8 away = abs8(v - __builtin_convertvector(t, F8)) >= 0.5f;
      const I8 sign = select(v < 0.0f, I8{} - 1, I8{} + 1);
      store8(yb + j, __builtin_convertvector(t + (away & sign), F8) * dh);
    }
  }
}

void fake_quantize_row_q6_K(const float* x, float* y, int64_t k) {
  check_k256(k, "fake_quantize_row_q6_K");
  fake_quantize_blocks<BlockQ6_K, kBlockK>(x, y, k, quantize_row_q6_K, dequantize_row_q6_K);
}

void q6_K_scales(const float* x, Q6_KScales* y, int64_t k) {
  check_k256(k, "q6_K_scales");
  for (int64_t b = 0; b < k / kBlockK; ++b) block_scales(search_sub_blocks(x + b * kBlockK), y[b]);
}

void fake_quantize_row_q6_K_scaled(const float* x, const Q6_KScales* scales, float* y, int64_t k) {
  check_k256(k, "fake_quantize_row_q6_K_scaled");
  for (int64_t b = 0; b < k / kBlockK; ++b) {
    const float* xb = x + b * kBlockK;
    float* yb = y + b * kBlockK;
    const float d_super = fp16_to_fp32(scales[b].d);
    float d[16];
    bool zero_scale = false;
    for (int s = 0; s < 16; ++s) {
      d[s] = d_super * static_cast<float>(scales[b].scales[s]);
      zero_scale |= d[s] == 0.0f;
    }
    if (zero_scale) {  // rare: levels from the sub-block's own search, which was not kept
      fake_quantize_row_q6_K(xb, yb, kBlockK);
      continue;
    }
    for (int s = 0; s < 16; ++s)
      for (int i = 0; i < 16; ++i) {
        const int l = std::clamp(nearest_int(xb[16 * s + i] / d[s]), -32, 31);
        yb[16 * s + i] = d[s] * static_cast<float>(l);  // dequantize_row_q6_K's d * sc * q
      }
  }
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
