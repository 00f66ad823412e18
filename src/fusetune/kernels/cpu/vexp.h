#pragma once
// exp() that vectorizes. glibc's expf is a scalar call unless -ffast-math, so a softmax over a
// [tokens x vocab] row would run one lane at a time; this version is plain arithmetic and bit
// manipulation, which `#pragma omp simd` loops turn into AVX2/AVX-512 code.
//
// float: Cody-Waite reduction x = n ln2 + r (|r| <= ln2/2), Cephes degree-6 polynomial, 2^n
// built from exponent bits. Relative error under 3 ulp. Results below ~2e-38 (x < -86.9)
// flush to 0 (no denormals); x > 88.72 gives +inf; NaN stays NaN. double: std::exp (used only
// by float64 gradient checks, where speed does not matter).
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace fusetune::kernels::detail {

inline float vexp(float x) {
  constexpr float kHi = 88.7228394f;   // log(FLT_MAX)
  constexpr float kLo = -87.3365479f;  // log(FLT_MIN): 2^n stays a normal number
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;  // ln2 split so n * kLn2Hi is exact
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  float xc = x > kHi ? kHi : x;
  xc = xc < kLo ? kLo : xc;  // NaN passes both comparisons unchanged
  const float kf = xc * kLog2e + kMagic;
  const int32_t n = std::bit_cast<int32_t>(kf) - std::bit_cast<int32_t>(kMagic);
  const float nf = kf - kMagic;
  float r = xc - nf * kLn2Hi;
  r = r - nf * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  // 2^n as 2^(n-1) * 2 so that n = 128 (x near kHi) does not overflow the exponent field.
  const float scale = std::bit_cast<float>(static_cast<uint32_t>(n + 126) << 23);
  float y = p * scale * 2.0f;
  y = x < kLo ? 0.0f : y;
  y = x > kHi ? std::numeric_limits<float>::infinity() : y;
  return y;
}

inline double vexp(double x) { return std::exp(x); }

}  // namespace fusetune::kernels::detail
