#pragma once
// log() that vectorizes, as vexp.h's exp: glibc's logf is a scalar call unless -ffast-math.
//
// float: x = m 2^e with m in [sqrt(1/2), sqrt(2)), log x = e ln2 + log1p(m - 1), log1p by the
// Cephes degree-9 polynomial; ln2 split in two so e ln2 adds exactly. Relative error under
// 2 ulp for normal x. x = 0 (or subnormal) gives -inf, x < 0 NaN, +inf stays +inf, NaN stays
// NaN. double: std::log.
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace fusetune::kernels::detail {

inline float vlog(float x) {
  constexpr float kSqrtHalf = 0.707106781186547524f;
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  // Exponent and mantissa in [0.5, 1): m = 0.5 * 1.mantissa, e unbiased + 1.
  int32_t e = int32_t((bits >> 23) & 0xffu) - 126;
  float m = std::bit_cast<float>((bits & 0x807fffffu) | 0x3f000000u);
  // Into [sqrt(1/2), sqrt(2)): below sqrt(1/2) double m and take one from e.
  const bool low = m < kSqrtHalf;
  e -= low ? 1 : 0;
  m = low ? m + m : m;
  const float f = m - 1.0f;
  const float z = f * f;
  float p = 7.0376836292e-2f;
  p = p * f - 1.1514610310e-1f;
  p = p * f + 1.1676998740e-1f;
  p = p * f - 1.2420140846e-1f;
  p = p * f + 1.4249322787e-1f;
  p = p * f - 1.6668057665e-1f;
  p = p * f + 2.0000714765e-1f;
  p = p * f - 2.4999993993e-1f;
  p = p * f + 3.3333331174e-1f;
  const float ef = float(e);
  float y = f * z * p;
  y = y + ef * -2.12194440e-4f;  // the low part of ln2
  y = y - 0.5f * z;
  float r = f + y;
  r = r + ef * 0.693359375f;  // the high part of ln2: exact in float
  const float kInf = std::numeric_limits<float>::infinity();
  r = x < std::numeric_limits<float>::min() ? -kInf : r;  // 0 and subnormals
  r = x < 0.f ? std::numeric_limits<float>::quiet_NaN() : r;
  r = x == kInf ? kInf : r;
  r = x != x ? x : r;
  return r;
}

inline double vlog(double x) { return std::log(x); }

}  // namespace fusetune::kernels::detail
