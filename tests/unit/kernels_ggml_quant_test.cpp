// llama.cpp's Q4_0 / Q8_0 blocks and fp16: hand-computed blocks (ties, all-zero blocks, a
// negative max, the +8 cap), fp16 against an independent double-precision rounding, and
// fake quantization == dequantize(quantize(x)).
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
