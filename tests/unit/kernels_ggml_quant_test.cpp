// llama.cpp's Q4_0 / Q8_0 / Q6_K / Q8_K blocks and fp16: hand-computed blocks (ties, all-zero
// blocks, a negative max, the +8 cap, a single large value), fp16 against an independent
// double-precision rounding, Q6_K / Q8_K against a scalar transcription of ggml's reference
// quantizers, and fake quantization == dequantize(quantize(x)).
#include <gtest/gtest.h>

#include <cfenv>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "fusetune/kernels/cpu/ggml_quant.h"
#include "fusetune/util/error.h"

using namespace fusetune::ggml;

namespace {

// IEEE binary16 rounding of x, done in double: the value, not the bits (round to nearest even
// at the half's ulp, which is 2^(e-10) for normals and 2^-24 for subnormals).
double half_value_reference(float x) {
  const double a = std::fabs(double(x));
  if (a == 0) return x;
  int e = std::ilogb(a);
  if (e < -14) e = -14;
  const double ulp = std::ldexp(1.0, e - 10);
  const double r = std::nearbyint(a / ulp) * ulp;  // default mode: ties to even
  const double v = r >= 65520.0 ? std::numeric_limits<double>::infinity() : r;
  return std::signbit(x) ? -v : v;
}

}  // namespace

TEST(GgmlQuant, Fp16KnownBits) {
  EXPECT_EQ(fp32_to_fp16(0.0f), 0x0000);
  EXPECT_EQ(fp32_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(fp32_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(fp32_to_fp16(-2.0f), 0xc000);
  EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16(65519.0f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7c00);  // the tie rounds to even: infinity
  EXPECT_EQ(fp32_to_fp16(1e10f), 0x7c00);
  EXPECT_EQ(fp32_to_fp16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(fp32_to_fp16(std::numeric_limits<float>::quiet_NaN()) & 0x7e00, 0x7e00);
  EXPECT_EQ(fp32_to_fp16(0x1p-24f), 0x0001);           // smallest subnormal
  EXPECT_EQ(fp32_to_fp16(0x1p-25f), 0x0000);           // half of it: tie to even (0)
  EXPECT_EQ(fp32_to_fp16(0x1.8p-24f), 0x0002);         // 1.5 units: tie to even (2)
  EXPECT_EQ(fp32_to_fp16(0x1p-14f), 0x0400);           // smallest normal
  EXPECT_EQ(fp32_to_fp16(0x1.ffcp-15f), 0x0400);       // rounds up across the subnormal edge
  EXPECT_EQ(fp32_to_fp16(1.0f + 0x1p-11f), 0x3c00);    // tie between 1 and 1+2^-10: even
  EXPECT_EQ(fp32_to_fp16(1.0f + 0x1.8p-10f), 0x3c02);  // tie between odd and even: up
  EXPECT_EQ(fp16_to_fp32(0x0001), 0x1p-24f);
  EXPECT_EQ(fp16_to_fp32(0x3555), 0.333251953125f);
  EXPECT_EQ(fp16_to_fp32(0xfbff), -65504.0f);
  EXPECT_TRUE(std::isinf(fp16_to_fp32(0x7c00)));
  EXPECT_TRUE(std::isnan(fp16_to_fp32(0x7e00)));
}

TEST(GgmlQuant, Fp16RoundTripsEveryHalfAndMatchesDoubleRounding) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t b = static_cast<uint16_t>(h);
    const float f = fp16_to_fp32(b);
    if (std::isnan(f)) continue;
    ASSERT_EQ(fp32_to_fp16(f), b) << h;
  }
  ASSERT_EQ(std::fegetround(), FE_TONEAREST);
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits(0, 0xffffffffu);
  for (int i = 0; i < 200000; ++i) {
    // Random bit patterns biased into the half range (exponents 100..145).
    uint32_t u = bits(rng);
    u = (u & 0x807fffffu) | ((100u + (u >> 23) % 46u) << 23);
    float x;
    std::memcpy(&x, &u, 4);
    const double want = half_value_reference(x);
    const float got = fp16_to_fp32(fp32_to_fp16(x));
    ASSERT_EQ(double(got), want) << x;
    ASSERT_EQ(std::signbit(got), std::signbit(x));
  }
}

TEST(GgmlQuant, Q4_0HandComputedBlock) {
  // max |x| = 8 at a positive value: d = 8 / -8 = -1, id = -1, q = trunc(-x + 8.5).
  std::vector<float> x(32, 0.0f);
  x[0] = 8.0f;    // -8 + 8.5 = 0.5 -> 0 (value (0-8)*-1 = 8)
  x[1] = -8.0f;   // 16.5 -> 16, capped at 15 (value -7): the opposite of max loses
  x[2] = 0.5f;    // 8.0 -> 8 (value 0)
  x[3] = -0.5f;   // 9.0 -> 9 (value -1): ties go up in q, i.e. towards -inf in x here
  x[4] = 2.4f;    // 6.1 -> 6 (value 2)
  x[5] = 2.6f;    // 5.9 -> 5 (value 3)
  x[16] = -3.0f;  // 11.5 -> 11 (value -3)
  x[17] = 1.5f;   // 7.0 -> 7 (value 1)
  x[31] = 7.9f;   // 0.6 -> 0 (value 8)
  BlockQ4_0 q;
  quantize_row_q4_0(x.data(), &q, 32);
  EXPECT_EQ(q.d, 0xbc00);  // -1.0 in fp16
  const int want[32] = {0,  15, 8, 9, 6, 5, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8,
                        11, 7,  8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 0};
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(q.qs[j] & 0x0f, want[j]) << j;
    EXPECT_EQ(q.qs[j] >> 4, want[j + 16]) << j + 16;
  }
  std::vector<float> y(32);
  dequantize_row_q4_0(&q, y.data(), 32);
  EXPECT_EQ(y[0], 8.0f);
  EXPECT_EQ(y[1], -7.0f);
  EXPECT_EQ(y[3], -1.0f);
  EXPECT_EQ(y[5], 3.0f);
  EXPECT_EQ(y[16], -3.0f);
  EXPECT_EQ(y[31], 8.0f);
}

TEST(GgmlQuant, Q4_0NegativeMaxFirstOnTiesAndZeroBlock) {
  // Two blocks: the first has its largest magnitude at a negative value (and a later +4 of the
  // same magnitude, which does not replace it: strict <), the second is all zeros.
  std::vector<float> x(64, 0.0f);
  x[3] = -4.0f;
  x[9] = 4.0f;
  x[10] = 1.0f;
  BlockQ4_0 q[2];
  quantize_row_q4_0(x.data(), q, 64);
  EXPECT_EQ(fp16_to_fp32(q[0].d), 0.5f);  // d = -4 / -8
  // q = trunc(x * 2 + 8.5): -4 -> 0, +4 -> 16 capped to 15, 1 -> 10, 0 -> 8.
  EXPECT_EQ(q[0].qs[3] & 0x0f, 0);
  EXPECT_EQ(q[0].qs[9] & 0x0f, 15);
  EXPECT_EQ(q[0].qs[10] & 0x0f, 10);
  EXPECT_EQ(q[0].qs[0], 0x88);
  // All zero: d = 0 / -8 = -0.0 (fp16 0x8000, as ggml writes it), id = 0, every q = 8.
  EXPECT_EQ(q[1].d, 0x8000);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(q[1].qs[j], 0x88);
  std::vector<float> y(64);
  dequantize_row_q4_0(q, y.data(), 64);
  EXPECT_EQ(y[3], -4.0f);
  EXPECT_EQ(y[9], 3.5f);
  EXPECT_EQ(y[10], 1.0f);
  for (int j = 32; j < 64; ++j) EXPECT_EQ(y[j], 0.0f);
}

TEST(GgmlQuant, Q4_0ScaleIsStoredAsFp16ButQuantizesWithFp32) {
  // max = 0.1: d = -0.0125 is not a half; dequantization multiplies by its fp16 rounding.
  std::vector<float> x(32, 0.0f);
  x[0] = 0.1f;
  x[1] = 0.05f;
  BlockQ4_0 q;
  quantize_row_q4_0(x.data(), &q, 32);
  const float d16 = fp16_to_fp32(q.d);
  EXPECT_EQ(double(d16), half_value_reference(0.1f / -8.0f));
  EXPECT_NE(d16, 0.1f / -8.0f);
  // 0.05 * (1 / -0.0125) + 8.5 = 4.5 -> 4: value (4 - 8) * d16.
  EXPECT_EQ(q.qs[1] & 0x0f, 4);
  std::vector<float> y(32);
  dequantize_row_q4_0(&q, y.data(), 32);
  EXPECT_EQ(y[1], -4.0f * d16);
  EXPECT_EQ(y[0], -8.0f * d16);
}

TEST(GgmlQuant, Q8_0HandComputedBlockRoundsHalfAwayFromZero) {
  // amax = 127 -> d = 1, id = 1: q = roundf(x).
  std::vector<float> x(32, 0.0f);
  x[0] = -127.0f;
  x[1] = 2.5f;    // roundf: 3 (nearbyint would give 2)
  x[2] = -2.5f;   // -3
  x[3] = 0.49f;   // 0
  x[4] = 126.5f;  // 127
  x[31] = 64.0f;
  BlockQ8_0 q[2];
  std::vector<float> x2(64, 0.0f);
  std::copy(x.begin(), x.end(), x2.begin());
  quantize_row_q8_0(x2.data(), q, 64);
  EXPECT_EQ(q[0].d, 0x3c00);
  EXPECT_EQ(q[0].qs[0], -127);
  EXPECT_EQ(q[0].qs[1], 3);
  EXPECT_EQ(q[0].qs[2], -3);
  EXPECT_EQ(q[0].qs[3], 0);
  EXPECT_EQ(q[0].qs[4], 127);
  EXPECT_EQ(q[0].qs[31], 64);
  EXPECT_EQ(q[1].d, 0);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(q[1].qs[j], 0);
  std::vector<float> y(64);
  dequantize_row_q8_0(q, y.data(), 64);
  EXPECT_EQ(y[1], 3.0f);
  EXPECT_EQ(y[2], -3.0f);
  for (int j = 32; j < 64; ++j) EXPECT_EQ(y[j], 0.0f);
}

TEST(GgmlQuant, Q8_0MatchesAnIndependentReferenceOnRandomData) {
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.0f, 0.02f);
  std::vector<float> x(32 * 64);
  for (auto& v : x) v = n(rng);
  std::vector<BlockQ8_0> q(64);
  quantize_row_q8_0(x.data(), q.data(), int64_t(x.size()));
  for (int b = 0; b < 64; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    const float d = amax / 127.0f;
    ASSERT_EQ(double(fp16_to_fp32(q[b].d)), half_value_reference(d));
    for (int j = 0; j < 32; ++j) {
      const float t = x[b * 32 + j] * (1.0f / d);
      const long want = std::lround(t);
      ASSERT_EQ(q[b].qs[j], want);
    }
  }
}

TEST(GgmlQuant, FakeQuantizeIsDequantizeOfQuantizeAndWorksInPlace) {
  std::mt19937 rng(11);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(96);
  for (auto& v : x) v = n(rng);
  std::vector<BlockQ4_0> q4(3);
  std::vector<BlockQ8_0> q8(3);
  std::vector<float> want4(96), want8(96);
  quantize_row_q4_0(x.data(), q4.data(), 96);
  dequantize_row_q4_0(q4.data(), want4.data(), 96);
  quantize_row_q8_0(x.data(), q8.data(), 96);
  dequantize_row_q8_0(q8.data(), want8.data(), 96);
  std::vector<float> y4(96), y8 = x;
  fake_quantize_row_q4_0(x.data(), y4.data(), 96);
  fake_quantize_row_q8_0(y8.data(), y8.data(), 96);  // in place
  EXPECT_EQ(0, std::memcmp(y4.data(), want4.data(), 96 * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(y8.data(), want8.data(), 96 * sizeof(float)));
  // Idempotent for Q8_0 (the values are already on the grid, amax maps to +-127 again).
  std::vector<float> z8 = y8;
  fake_quantize_row_q8_0(z8.data(), z8.data(), 96);
  EXPECT_EQ(0, std::memcmp(z8.data(), y8.data(), 96 * sizeof(float)));
}

// The fake quantizers compute the dequantized values directly (vectorized); bit for bit the
// packed round trip on blocks with ties, outliers, zeros and subnormal-tiny scales.
TEST(GgmlQuant, Q4_0AndQ8_0FakeQuantizeBitwiseTheRoundTripOnEdgeCases) {
  std::mt19937 rng(17);
  std::normal_distribution<float> n(0.0f, 1.0f);
  constexpr int kBlocks = 600;
  for (float scale : {1e-41f, 1e-30f, 1e-3f, 1.0f, 1e30f}) {
    std::vector<float> x(32 * kBlocks);
    for (int b = 0; b < kBlocks; ++b) {
      float* xb = x.data() + 32 * b;
      for (int j = 0; j < 32; ++j) xb[j] = scale * n(rng);
      if (b % 4 == 1)  // exact halves after scaling: ties for roundf and for the + 8.5 cut
        for (int j = 0; j < 32; ++j) xb[j] = scale * (float(int(rng() % 33) - 16) * 0.25f);
      if (b % 6 == 2) std::fill(xb, xb + 32, 0.0f);
      if (b % 9 == 3) xb[rng() % 32] *= -50.0f;
    }
    std::vector<BlockQ4_0> q4(kBlocks);
    std::vector<BlockQ8_0> q8(kBlocks);
    std::vector<float> want4(x.size()), want8(x.size()), got(x.size());
    quantize_row_q4_0(x.data(), q4.data(), int64_t(x.size()));
    dequantize_row_q4_0(q4.data(), want4.data(), int64_t(x.size()));
    quantize_row_q8_0(x.data(), q8.data(), int64_t(x.size()));
    dequantize_row_q8_0(q8.data(), want8.data(), int64_t(x.size()));
    fake_quantize_row_q4_0(x.data(), got.data(), int64_t(x.size()));
    ASSERT_EQ(0, std::memcmp(got.data(), want4.data(), x.size() * sizeof(float))) << scale;
    fake_quantize_row_q8_0(x.data(), got.data(), int64_t(x.size()));
    ASSERT_EQ(0, std::memcmp(got.data(), want8.data(), x.size() * sizeof(float))) << scale;
  }
}

TEST(GgmlQuant, RowLengthNotAMultipleOf32Throws) {
  std::vector<float> x(40, 1.0f);
  std::vector<BlockQ4_0> q(2);
  EXPECT_THROW(quantize_row_q4_0(x.data(), q.data(), 40), fusetune::Error);
  EXPECT_THROW(fake_quantize_row_q8_0(x.data(), x.data(), 40), fusetune::Error);
}

TEST(GgmlQuant, ActivationRoundingAsLlamaCppCpuTiesToEven) {
  // amax = 127: id = 1, d = 1; ties go to even (2.5 -> 2, 3.5 -> 4, -2.5 -> -2), unlike the
  // reference quantizer's roundf (3, 4, -3).
  std::vector<float> x(32, 0.0f);
  x[0] = 127.0f;
  x[1] = 2.5f;
  x[2] = 3.5f;
  x[3] = -2.5f;
  x[4] = 0.4f;
  std::vector<float> y(32), r(32);
  fake_quantize_activations_q8_0(x.data(), y.data(), 32);
  fake_quantize_row_q8_0(x.data(), r.data(), 32);
  EXPECT_EQ(y[0], 127.0f);
  EXPECT_EQ(y[1], 2.0f);
  EXPECT_EQ(r[1], 3.0f);
  EXPECT_EQ(y[2], 4.0f);
  EXPECT_EQ(y[3], -2.0f);
  EXPECT_EQ(r[3], -3.0f);
  EXPECT_EQ(y[4], 0.0f);
  // amax = 0.3: the scale is fp16(0.3 / 127) and x * (127 / 0.3) is rounded before scaling.
  std::vector<float> z(32, 0.0f);
  z[0] = 0.3f;
  z[1] = -0.1f;
  fake_quantize_activations_q8_0(z.data(), z.data(), 32);  // in place
  const float d = fp16_to_fp32(fp32_to_fp16(0.3f / 127.0f));
  EXPECT_EQ(z[0], 127.0f * d);
  EXPECT_EQ(z[1], -42.0f * d);  // -0.1 * 423.33 = -42.33 -> -42
  EXPECT_EQ(z[2], 0.0f);
}

TEST(GgmlQuant, BlocksSoTinyThat1OverDOverflowsGiveZeros) {
  // amax = 1e-40 (subnormal): 1/d is inf, so x * id is inf or NaN; ggml's cast gives 0 on x86
  // and the fp16 scale is 0: every value dequantizes to zero, nothing undefined happens.
  std::vector<float> x(32, 0.0f);
  x[0] = -1e-40f;
  x[5] = 5e-41f;
  BlockQ4_0 q4;
  quantize_row_q4_0(x.data(), &q4, 32);
  EXPECT_EQ(q4.d & 0x7fff, 0);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(q4.qs[j], 0) << j;
  BlockQ8_0 q8;
  quantize_row_q8_0(x.data(), &q8, 32);
  EXPECT_EQ(q8.d, 0);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(q8.qs[j], 0) << j;
  std::vector<float> y(32);
  for (auto f : {fake_quantize_row_q4_0, fake_quantize_row_q8_0, fake_quantize_activations_q8_0}) {
    f(x.data(), y.data(), 32);
    for (float v : y) EXPECT_EQ(v, 0.0f);
  }
}

// ---- Q6_K and Q8_K (super-blocks of 256) ----

namespace {

// An independent scalar transcription of ggml's reference Q6_K / Q8_K quantizers
// (ggml-quants.c: nearest_int, make_qx_quants, quantize_row_q6_K_ref, quantize_row_q8_K_ref),
// written as plainly as the C, into raw bytes at block_q6_K's offsets (ql 0, qh 128, scales 192,
// d 208), to compare byte for byte with the library's.
int ref_nearest_int(float fval) {
  float val = fval + 12582912.f;
  int i;
  std::memcpy(&i, &val, sizeof(int));
  return (i & 0x007fffff) - 0x00400000;
}

float ref_make_qx_quants(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < 1e-15f) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    int l = ref_nearest_int(iscale * x[i]);
    l = std::max(-nmax, std::min(nmax - 1, l));
    L[i] = int8_t(l + nmax);
    float w = x[i] * x[i];  // rmse_type 1, no importance weights
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      int l = ref_nearest_int(iscale * x[i]);
      l = std::max(-nmax, std::min(nmax - 1, l));
      float w = x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        int l = ref_nearest_int(iscale * x[i]);
        L[i] = int8_t(nmax + std::max(-nmax, std::min(nmax - 1, l)));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

void ref_quantize_q6_K_block(const float* x, uint8_t* blk) {
  uint8_t* ql = blk;
  uint8_t* qh = blk + 128;
  int8_t* sc = reinterpret_cast<int8_t*>(blk + 192);
  int8_t L[256];
  float scales[16];
  float max_scale = 0, max_abs_scale = 0;
  for (int ib = 0; ib < 16; ++ib) {
    const float scale = ref_make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
    scales[ib] = scale;
    if (std::fabs(scale) > max_abs_scale) {
      max_abs_scale = std::fabs(scale);
      max_scale = scale;
    }
  }
  if (max_abs_scale < 1e-15f) {
    std::memset(blk, 0, 210);
    return;
  }
  float iscale = -128.f / max_scale;
  const uint16_t dh = fp32_to_fp16(1 / iscale);
  std::memcpy(blk + 208, &dh, 2);
  for (int ib = 0; ib < 16; ++ib)
    sc[ib] = int8_t(std::min(127, ref_nearest_int(iscale * scales[ib])));
  for (int j = 0; j < 16; ++j) {
    float d = fp16_to_fp32(dh) * sc[j];
    if (!d) continue;
    for (int ii = 0; ii < 16; ++ii) {
      int l = ref_nearest_int(x[16 * j + ii] / d);
      l = std::max(-32, std::min(31, l));
      L[16 * j + ii] = int8_t(l + 32);
    }
  }
  for (int j = 0; j < 256; j += 128) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t q1 = L[j + l + 0] & 0xF;
      const uint8_t q2 = L[j + l + 32] & 0xF;
      const uint8_t q3 = L[j + l + 64] & 0xF;
      const uint8_t q4 = L[j + l + 96] & 0xF;
      ql[l + 0] = uint8_t(q1 | (q3 << 4));
      ql[l + 32] = uint8_t(q2 | (q4 << 4));
      qh[l] = uint8_t((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                      ((L[j + l + 96] >> 4) << 6));
    }
    ql += 64;
    qh += 32;
  }
}

// Q8_K: an all-zero block is d = 0, qs = 0 (ggml leaves its bsums unset; compared without).
void ref_quantize_q8_K_block(const float* x, float& d, int8_t* qs, int16_t* bsums) {
  float max = 0, amax = 0;
  for (int j = 0; j < 256; ++j) {
    float ax = std::fabs(x[j]);
    if (ax > amax) {
      amax = ax;
      max = x[j];
    }
  }
  if (!amax) {
    d = 0;
    std::memset(qs, 0, 256);
    return;
  }
  const float iscale = -127.f / max;
  for (int j = 0; j < 256; ++j) qs[j] = int8_t(std::min(127, ref_nearest_int(iscale * x[j])));
  for (int j = 0; j < 16; ++j) {
    int sum = 0;
    for (int ii = 0; ii < 16; ++ii) sum += qs[j * 16 + ii];
    bsums[j] = int16_t(sum);
  }
  d = 1 / iscale;
}

}  // namespace

TEST(GgmlQuant, Q6_KAllZeroBlockIsAllZeroBytes) {
  std::vector<float> x(256, 0.0f);
  BlockQ6_K q;
  std::memset(&q, 0xab, sizeof(q));
  quantize_row_q6_K(x.data(), &q, 256);
  const auto* bytes = reinterpret_cast<const uint8_t*>(&q);
  for (size_t i = 0; i < sizeof(q); ++i) ASSERT_EQ(bytes[i], 0) << i;
  std::vector<float> y(256, 1.0f);
  dequantize_row_q6_K(&q, y.data(), 256);
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

TEST(GgmlQuant, Q6_KSingleLargeValueHandComputed) {
  // x[70] = 1, the rest 0. Sub-block 4 (elements 64..79): max = 1, every candidate scale gives
  // level -32 for the 1 (fit scale -1/32); the other sub-blocks are all zero (scale 0, levels
  // 0). Super-block: max_scale = -1/32, iscale = 4096, d = fp16(2^-12) = 0x0c00, scales[4] =
  // -128; the 1 requantizes to -32 (stored 0), the other elements of sub-block 4 to 0 (stored
  // 32: high bits 2); the zero sub-blocks keep stored level 0.
  for (float sign : {1.0f, -1.0f}) {
    std::vector<float> x(256, 0.0f);
    x[70] = sign;
    BlockQ6_K q;
    quantize_row_q6_K(x.data(), &q, 256);
    // Negative max: the sub-block's fit scale is +1/32, d = -2^-12 (0x8c00), scales[4] still -128.
    EXPECT_EQ(q.d, sign > 0 ? 0x0c00 : 0x8c00);
    for (int s = 0; s < 16; ++s) EXPECT_EQ(q.scales[s], s == 4 ? -128 : 0) << s;
    for (int i = 0; i < 128; ++i) EXPECT_EQ(q.ql[i], 0) << i;
    // Elements 64..79 sit in the third slot (bits 4-5) of qh[0..15] in the first half.
    for (int l = 0; l < 64; ++l) EXPECT_EQ(q.qh[l], (l < 16 && l != 6) ? 0x20 : 0) << l;
    std::vector<float> y(256);
    dequantize_row_q6_K(&q, y.data(), 256);
    for (int j = 0; j < 256; ++j) EXPECT_EQ(y[j], j == 70 ? sign : 0.0f) << j;
  }
}

TEST(GgmlQuant, Q8_KHandComputedTiesToEvenAndNegativeMax) {
  // max = -127: iscale = -127 / -127 = 1, d = 1; nearest_int rounds ties to even.
  std::vector<float> x(512, 0.0f);
  x[0] = -127.0f;
  x[1] = 0.5f;
  x[2] = 1.5f;
  x[3] = 2.5f;
  x[4] = -0.5f;
  x[17] = 126.6f;
  // Second block: one value 2 (positive max): iscale = -63.5, q = -127, d = 1 / -63.5.
  x[256 + 40] = 2.0f;
  BlockQ8_K q[2];
  quantize_row_q8_K(x.data(), q, 512);
  EXPECT_EQ(q[0].d, 1.0f);
  EXPECT_EQ(q[0].qs[0], -127);
  EXPECT_EQ(q[0].qs[1], 0);
  EXPECT_EQ(q[0].qs[2], 2);
  EXPECT_EQ(q[0].qs[3], 2);
  EXPECT_EQ(q[0].qs[4], 0);
  EXPECT_EQ(q[0].qs[17], 127);
  EXPECT_EQ(q[0].bsums[0], -127 + 2 + 2);
  EXPECT_EQ(q[0].bsums[1], 127);
  for (int g = 2; g < 16; ++g) EXPECT_EQ(q[0].bsums[g], 0);
  EXPECT_EQ(q[1].d, 1.0f / -63.5f);
  EXPECT_EQ(q[1].qs[40], -127);
  EXPECT_EQ(q[1].bsums[2], -127);
  std::vector<float> y(512);
  fake_quantize_row_q8_K(x.data(), y.data(), 512);
  EXPECT_EQ(y[3], 2.0f);
  EXPECT_EQ(y[17], 127.0f);
  EXPECT_EQ(y[256 + 40], -127.0f * (1.0f / -63.5f));
  // All zero: d = 0, zeros out.
  std::vector<float> z(256, 0.0f);
  BlockQ8_K qz;
  quantize_row_q8_K(z.data(), &qz, 256);
  EXPECT_EQ(qz.d, 0.0f);
  for (int j = 0; j < 256; ++j) EXPECT_EQ(qz.qs[j], 0);
}

// kBlocks super-blocks of random values times `scale`, with the cases the quantizers treat
// apart: outliers, zero sub-blocks, ties, sparse tiny blocks, and sub-blocks 1e-4 the size of
// the rest (their int8 scale rounds to 0, so ggml keeps their search's levels).
std::vector<float> q6_test_blocks(float scale, int kBlocks, std::mt19937& rng) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(256 * size_t(kBlocks));
  for (int b = 0; b < kBlocks; ++b) {
    float* xb = x.data() + 256 * b;
    for (int j = 0; j < 256; ++j) xb[j] = scale * (b % 2 ? n(rng) : u(rng));
    if (b % 5 == 1) xb[rng() % 256] *= 40.0f;                                      // an outlier
    if (b % 7 == 2) std::fill(xb + 16 * (b % 16), xb + 16 * (b % 16) + 16, 0.0f);  // zero sub-block
    if (b % 11 == 3)
      for (int j = 0; j < 256; ++j) xb[j] = scale * float(int(rng() % 9) - 4);  // ties
    if (b % 13 == 4)
      for (int j = 0; j < 256; ++j) xb[j] *= 1e-3f * float(j % 16 == 0);  // sparse, tiny
    if (b % 17 == 5)
      for (int j = 16 * (b % 16); j < 16 * (b % 16) + 16; ++j) xb[j] *= 1e-4f;  // int8 scale 0
  }
  return x;
}

TEST(GgmlQuant, Q6_KAndQ8_KMatchAScalarTranscriptionOfGgmlOnRandomData) {
  std::mt19937 rng(2026);
  constexpr int kBlocks = 400;
  int changed_scales = 0, zero_int8_scales = 0;
  for (float scale : {1e-6f, 1e-3f, 0.02f, 1.0f, 300.0f}) {
    const std::vector<float> x = q6_test_blocks(scale, kBlocks, rng);
    std::vector<BlockQ6_K> q6(kBlocks);
    quantize_row_q6_K(x.data(), q6.data(), int64_t(x.size()));
    std::vector<BlockQ8_K> q8(kBlocks);
    quantize_row_q8_K(x.data(), q8.data(), int64_t(x.size()));
    for (int b = 0; b < kBlocks; ++b) {
      uint8_t want[210];
      ref_quantize_q6_K_block(x.data() + 256 * b, want);
      ASSERT_EQ(0, std::memcmp(want, &q6[b], 210)) << "scale " << scale << " block " << b;
      for (int s = 0; s < 16; ++s) zero_int8_scales += q6[b].d != 0 && q6[b].scales[s] == 0;
      float d;
      int8_t qs[256];
      int16_t bsums[16] = {};
      ref_quantize_q8_K_block(x.data() + 256 * b, d, qs, bsums);
      ASSERT_EQ(d, q8[b].d) << b;
      ASSERT_EQ(0, std::memcmp(qs, q8[b].qs, 256)) << b;
      ASSERT_EQ(0, std::memcmp(bsums, q8[b].bsums, sizeof(bsums))) << b;
      // Count sub-blocks whose search moved off the first candidate (the fit is then not the
      // plain -max/32 grid), so the search itself is exercised.
      for (int s = 0; s < 16; ++s) {
        int8_t L[16];
        const float* xs = x.data() + 256 * b + 16 * s;
        ref_make_qx_quants(16, 32, xs, L);
        float mx = 0, am = 0;
        for (int i = 0; i < 16; ++i)
          if (std::fabs(xs[i]) > am) am = std::fabs(xs[i]), mx = xs[i];
        if (am > 0) {
          const float iscale0 = -32 / mx;
          int8_t L0[16];
          for (int i = 0; i < 16; ++i)
            L0[i] = int8_t(32 + std::max(-32, std::min(31, ref_nearest_int(iscale0 * xs[i]))));
          changed_scales += std::memcmp(L, L0, 16) != 0;
        }
      }
    }
    // Dequantization against the format's definition: value = d * scale * (level - 32).
    std::vector<float> y(x.size());
    dequantize_row_q6_K(q6.data(), y.data(), int64_t(y.size()));
    for (int b = 0; b < kBlocks; ++b) {
      const uint8_t* blk = reinterpret_cast<const uint8_t*>(&q6[b]);
      for (int j = 0; j < 256; ++j) {
        const int h = j / 128, r = j % 128, l = r % 32, slot = r / 32;
        const uint8_t lo = blk[64 * h + l + (slot & 1) * 32];
        const int low = (slot < 2) ? (lo & 0xf) : (lo >> 4);
        const int high = (blk[128 + 32 * h + l] >> (2 * slot)) & 3;
        const float want =
            fp16_to_fp32(q6[b].d) * float(q6[b].scales[j / 16]) * float((low | (high << 4)) - 32);
        ASSERT_EQ(y[256 * b + j], want) << b << " " << j;
      }
    }
  }
  EXPECT_GT(changed_scales, 100);   // the candidate search changed many sub-blocks' levels
  EXPECT_GT(zero_int8_scales, 50);  // and many kept their own search's levels
}

// The kept-scales path (what a fake-quantized LM head uses for every tile) against the plain
// fake quantization, bit for bit, on the same kinds of blocks; rows of several blocks.
TEST(GgmlQuant, Q6_KScalesThenScaledRoundingIsFakeQuantizeBitwise) {
  std::mt19937 rng(7);
  for (float scale : {1e-6f, 0.02f, 1.0f, 300.0f}) {
    const std::vector<float> x = q6_test_blocks(scale, 120, rng);
    std::vector<float> want(x.size()), got(x.size());
    fake_quantize_row_q6_K(x.data(), want.data(), int64_t(x.size()));
    std::vector<Q6_KScales> scales(120);
    q6_K_scales(x.data(), scales.data(), int64_t(x.size()));
    std::vector<BlockQ6_K> q(120);
    quantize_row_q6_K(x.data(), q.data(), int64_t(x.size()));
    for (int b = 0; b < 120; ++b) {
      ASSERT_EQ(scales[b].d, q[b].d) << b;
      ASSERT_EQ(0, std::memcmp(scales[b].scales, q[b].scales, 16)) << b;
    }
    fake_quantize_row_q6_K_scaled(x.data(), scales.data(), got.data(), int64_t(x.size()));
    ASSERT_EQ(0, std::memcmp(got.data(), want.data(), x.size() * sizeof(float))) << scale;
    got = x;  // in place
    fake_quantize_row_q6_K_scaled(got.data(), scales.data(), got.data(), int64_t(x.size()));
    ASSERT_EQ(0, std::memcmp(got.data(), want.data(), x.size() * sizeof(float))) << scale;
  }
}

TEST(GgmlQuant, Q6_KFakeQuantizeIsDequantizeOfQuantizeAndRowLengthChecked) {
  std::mt19937 rng(5);
  std::normal_distribution<float> n(0.0f, 0.05f);
  std::vector<float> x(512);
  for (auto& v : x) v = n(rng);
  std::vector<BlockQ6_K> q(2);
  std::vector<float> want(512), y = x;
  quantize_row_q6_K(x.data(), q.data(), 512);
  dequantize_row_q6_K(q.data(), want.data(), 512);
  fake_quantize_row_q6_K(y.data(), y.data(), 512);  // in place
  EXPECT_EQ(0, std::memcmp(y.data(), want.data(), 512 * sizeof(float)));
  std::vector<float> bad(288, 1.0f);
  BlockQ6_K qb[2];
  EXPECT_THROW(quantize_row_q6_K(bad.data(), qb, 288), fusetune::Error);
  EXPECT_THROW(fake_quantize_row_q8_K(bad.data(), bad.data(), 288), fusetune::Error);
}
