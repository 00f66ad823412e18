#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/kernels/cpu/vexp.h"
#include "fusetune/kernels/cpu/vlog.h"
#include "fusetune/util/error.h"
#include "kernels_test_util.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace {
// Sizes: tiny, odd, and past the OpenMP threshold (32768 elements).
const std::vector<int64_t> kSizes = {1, 3, 17, 67, 1000, 100003};
}  // namespace

TEST(KernelsElementwise, AddMulAllBroadcastModes) {
  for (int64_t rows : {1, 3, 67, 2001}) {
    for (int64_t nb : {1, 3, 17, 64}) {
      const int64_t n = rows * nb;
      const auto a = random_vec<float>(n, 1);
      for (int64_t blen : {n, nb, int64_t{1}}) {
        const auto b = random_vec<float>(blen, 2);
        std::vector<float> s(n), p(n);
        kernels::add<float>(a.data(), b.data(), s.data(), n, blen);
        kernels::mul<float>(a.data(), b.data(), p.data(), n, blen);
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(s[i], a[i] + b[i % blen]) << "add n=" << n << " nb=" << blen << " i=" << i;
          ASSERT_EQ(p[i], a[i] * b[i % blen]) << "mul n=" << n << " nb=" << blen << " i=" << i;
        }
      }
    }
  }
}

TEST(KernelsElementwise, AddInPlaceAndBadBroadcast) {
  std::vector<double> a = {1, 2, 3, 4, 5, 6};
  const std::vector<double> b = {10, 20, 30};
  kernels::add<double>(a.data(), b.data(), a.data(), 6, 3);
  EXPECT_EQ(a, (std::vector<double>{11, 22, 33, 14, 25, 36}));
  EXPECT_THROW(kernels::add<double>(a.data(), b.data(), a.data(), 6, 4), Error);
  EXPECT_THROW(kernels::mul<double>(a.data(), b.data(), a.data(), 6, 0), Error);
}

TEST(KernelsElementwise, ScaleAndSilu) {
  for (int64_t n : kSizes) {
    const auto x = random_vec<float>(n, 3, -30.0, 30.0);
    std::vector<float> y(n), s(n);
    kernels::scale<float>(x.data(), 0.25f, y.data(), n);
    kernels::silu<float>(x.data(), s.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(y[i], x[i] * 0.25f);
      const double xd = x[i];
      const double want = xd / (1.0 + std::exp(-xd));
      ASSERT_NEAR(s[i], want, 1e-6 * (1.0 + std::fabs(want))) << "silu x=" << xd;
    }
  }
  // Extremes do not produce NaN.
  const std::vector<float> ext = {-1e30f, -100.0f, 100.0f, 1e30f};
  std::vector<float> out(4);
  kernels::silu<float>(ext.data(), out.data(), 4);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_EQ(out[2], 100.0f);
  EXPECT_EQ(out[3], 1e30f);
}

TEST(KernelsElementwise, SiluBackwardMatchesFiniteDifferences) {
  const auto x = random_vec(67, 4, -6.0, 6.0);
  const int64_t n = 67;
  expect_vjp_matches_fd(
      x, n,
      [&](const std::vector<double>& xs) {
        std::vector<double> y(n);
        kernels::silu<double>(xs.data(), y.data(), n);
        return y;
      },
      [&](const std::vector<double>& xs, const std::vector<double>& dy) {
        std::vector<double> dx(n);
        kernels::silu_backward<double>(xs.data(), dy.data(), dx.data(), n);
        return dx;
      },
      "silu");
  // float backward on the parallel path agrees with the double one.
  const int64_t big = 100003;
  const auto xf = random_vec<float>(big, 5, -8.0, 8.0);
  const auto dyf = random_vec<float>(big, 6);
  std::vector<float> dxf(big);
  kernels::silu_backward<float>(xf.data(), dyf.data(), dxf.data(), big);
  const auto xd = to_double(xf), dyd = to_double(dyf);
  std::vector<double> dxd(big);
  kernels::silu_backward<double>(xd.data(), dyd.data(), dxd.data(), big);
  expect_close(dxf, dxd, 1e-5, 1e-6, "silu_backward float");
}

TEST(KernelsElementwise, SumToSuffixNarrowAndWide) {
  // Row chunks in general; few rows of >= 512 columns use column blocks. Both against a
  // double reference.
  for (int64_t rows : {1, 3, 16, 17, 67, 5000}) {
    for (int64_t nb : {1, 3, 17, 127, 300, 600}) {
      const int64_t n = rows * nb;
      const auto x = random_vec<float>(n, 7);
      std::vector<double> want(nb, 0.0);
      for (int64_t i = 0; i < n; ++i) want[i % nb] += x[i];
      std::vector<float> out(nb, -1.0f);
      kernels::sum_to_suffix<float>(x.data(), out.data(), n, nb);
      expect_close(out, want, 1e-6, 1e-6, "sum_to_suffix");
    }
  }
  std::vector<double> x(6), out(4);
  EXPECT_THROW(kernels::sum_to_suffix<double>(x.data(), out.data(), 6, 4), Error);
}

TEST(KernelsElementwise, SumAll) {
  for (int64_t n : kSizes) {
    const auto x = random_vec<float>(n, 8);
    double want = 0.0;
    for (float v : x) want += v;
    EXPECT_NEAR(kernels::sum_all<float>(x.data(), n), want, 1e-9 * n);
  }
  EXPECT_EQ(kernels::sum_all<float>(nullptr, 0), 0.0);
  // Accumulated in double: 2^24 + many ones would be lost in float.
  std::vector<float> big(70000, 1.0f);
  big[0] = 16777216.0f;
  EXPECT_EQ(kernels::sum_all<float>(big.data(), 70000), 16777216.0 + 69999.0);
}

TEST(KernelsElementwise, ReductionsIdenticalForAnyThreadCount) {
  // double data over 16 orders of magnitude, so any change of summation order shows up in the
  // last bits (float data summed in double is often exact and would hide it).
  auto spread = [](int64_t n, uint32_t seed) {
    auto v = random_vec(n, seed);
    const auto e = random_vec(n, seed + 1, -8.0, 8.0);
    for (size_t i = 0; i < v.size(); ++i) v[i] *= std::pow(10.0, e[i]);
    return v;
  };
  const int64_t rows = 3001, nb = 257;
  const auto x = spread(rows * nb, 9);
  const auto xs = spread(rows * 5, 11);
  const int64_t short_rows = 7, long_cols = 50000;  // the column-block path
  const auto xw = spread(short_rows * long_cols, 13);
  auto run = [&] {
    std::vector<double> wide(nb), narrow(5), short_wide(long_cols);
    kernels::sum_to_suffix<double>(x.data(), wide.data(), rows * nb, nb);
    kernels::sum_to_suffix<double>(xs.data(), narrow.data(), rows * 5, 5);
    kernels::sum_to_suffix<double>(xw.data(), short_wide.data(), short_rows * long_cols, long_cols);
    wide.insert(wide.end(), narrow.begin(), narrow.end());
    wide.insert(wide.end(), short_wide.begin(), short_wide.end());
    wide.push_back(kernels::sum_all<double>(x.data(), rows * nb));
    return wide;
  };
  std::vector<double> r1, r2, r3;
  with_threads(1, [&] { r1 = run(); });
  with_threads(2, [&] { r2 = run(); });
  with_threads(3, [&] { r3 = run(); });
  EXPECT_TRUE(bitwise_equal(r1, r2));
  EXPECT_TRUE(bitwise_equal(r2, r3));
  EXPECT_TRUE(bitwise_equal(run(), run()));
}

TEST(KernelsElementwise, VectorExpAccuracy) {
  // Relative error within 3 ulp on the range softmax uses, exact limits at the ends.
  double worst = 0.0;
  for (int i = 0; i <= 200000; ++i) {
    const float x = -86.0f + 174.0f * static_cast<float>(i) / 200000.0f;
    const double want = std::exp(static_cast<double>(x));
    if (want > std::numeric_limits<float>::max()) continue;
    worst = std::max(worst, std::fabs(kernels::detail::vexp(x) - want) / want);
  }
  EXPECT_LT(worst, 3.0 * std::numeric_limits<float>::epsilon());
  EXPECT_EQ(kernels::detail::vexp(0.0f), 1.0f);
  EXPECT_EQ(kernels::detail::vexp(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(kernels::detail::vexp(-1000.0f), 0.0f);
  EXPECT_EQ(kernels::detail::vexp(89.0f), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(kernels::detail::vexp(std::nanf(""))));
}

TEST(KernelsElementwise, VectorLogAccuracy) {
  // Relative error within 2 ulp of the result (absolute near x = 1, where log x -> 0) across
  // the normal floats, and the special values.
  double worst = 0.0;
  for (int i = 0; i <= 200000; ++i) {
    const float x = std::ldexp(1.0f + float(i % 1000) / 1000.0f, i / 1000 - 120);
    const double want = std::log(static_cast<double>(x));
    const double err = std::fabs(double(kernels::detail::vlog(x)) - want);
    worst = std::max(worst, err / std::max(std::fabs(want), 1.0));
  }
  EXPECT_LT(worst, 2.0 * std::numeric_limits<float>::epsilon());
  EXPECT_EQ(kernels::detail::vlog(1.0f), 0.0f);
  EXPECT_EQ(kernels::detail::vlog(0.0f), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(kernels::detail::vlog(1e-45f), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(kernels::detail::vlog(std::numeric_limits<float>::infinity()),
            std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(kernels::detail::vlog(-1.0f)));
  EXPECT_TRUE(std::isnan(kernels::detail::vlog(std::nanf(""))));
}
