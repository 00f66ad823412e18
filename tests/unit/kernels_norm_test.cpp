#include <gtest/gtest.h>

#include <cmath>
#include <utility>
#include <vector>

#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/util/error.h"
#include "kernels_test_util.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace {
std::vector<double> ref_rmsnorm(const std::vector<double>& x, const std::vector<double>& w,
                                int64_t rows, int64_t D, double eps) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (int64_t j = 0; j < D; ++j) ss += x[r * D + j] * x[r * D + j];
    const double rstd = 1.0 / std::sqrt(ss / D + eps);
    for (int64_t j = 0; j < D; ++j) y[r * D + j] = x[r * D + j] * rstd * w[j];
  }
  return y;
}
}  // namespace

TEST(KernelsNorm, RmsnormForwardMatchesReference) {
  for (auto [rows, D] : {std::pair<int64_t, int64_t>{1, 1}, {3, 17}, {67, 3}, {300, 257}}) {
    const auto x = random_vec<float>(rows * D, 1, -3.0, 3.0);
    const auto w = random_vec<float>(D, 2, 0.5, 1.5);
    std::vector<float> y(rows * D);
    kernels::rmsnorm_forward<float>(x.data(), w.data(), y.data(), rows, D, 1e-5);
    expect_close(y, ref_rmsnorm(to_double(x), to_double(w), rows, D, 1e-5), 1e-5, 1e-6, "rmsnorm");
  }
  // A zero row stays finite thanks to eps.
  std::vector<double> z(4, 0.0), w(4, 1.0), y(4);
  kernels::rmsnorm_forward<double>(z.data(), w.data(), y.data(), 1, 4, 1e-6);
  for (double v : y) EXPECT_EQ(v, 0.0);
  EXPECT_THROW(kernels::rmsnorm_forward<double>(z.data(), w.data(), y.data(), 1, 0, 1e-6), Error);
}

TEST(KernelsNorm, RmsnormBackwardMatchesFiniteDifferences) {
  const int64_t rows = 5, D = 7;
  const double eps = 1e-3;
  const auto x = random_vec(rows * D, 3, -2.0, 2.0);
  const auto w = random_vec(D, 4, 0.5, 1.5);
  expect_vjp_matches_fd(
      x, rows * D,
      [&](const std::vector<double>& xs) {
        std::vector<double> y(rows * D);
        kernels::rmsnorm_forward<double>(xs.data(), w.data(), y.data(), rows, D, eps);
        return y;
      },
      [&](const std::vector<double>& xs, const std::vector<double>& dy) {
        std::vector<double> dx(rows * D);
        kernels::rmsnorm_backward<double>(xs.data(), w.data(), dy.data(), dx.data(), nullptr, rows,
                                          D, eps);
        return dx;
      },
      "rmsnorm dx");
  expect_vjp_matches_fd(
      w, rows * D,
      [&](const std::vector<double>& ws) {
        std::vector<double> y(rows * D);
        kernels::rmsnorm_forward<double>(x.data(), ws.data(), y.data(), rows, D, eps);
        return y;
      },
      [&](const std::vector<double>& ws, const std::vector<double>& dy) {
        std::vector<double> dx(rows * D), dw(D, 123.0);  // dw is overwritten, not accumulated
        kernels::rmsnorm_backward<double>(x.data(), ws.data(), dy.data(), dx.data(), dw.data(),
                                          rows, D, eps);
        return dw;
      },
      "rmsnorm dw");
}

TEST(KernelsNorm, RmsnormBackwardLargeFloatAndDeterministic) {
  // Wide D (column-block dw) and narrow D (row-chunk dw), past the OpenMP threshold.
  for (auto [rows, D] : {std::pair<int64_t, int64_t>{500, 257}, {9000, 5}}) {
    const auto x = random_vec<float>(rows * D, 5, -2.0, 2.0);
    const auto w = random_vec<float>(D, 6, 0.5, 1.5);
    const auto dy = random_vec<float>(rows * D, 7);
    // Bindings copied into the lambdas: clang 14 cannot capture structured bindings.
    auto run = [&, rows = rows, D = D] {
      std::vector<float> dx(rows * D), dw(D);
      kernels::rmsnorm_backward<float>(x.data(), w.data(), dy.data(), dx.data(), dw.data(), rows, D,
                                       1e-5);
      dx.insert(dx.end(), dw.begin(), dw.end());
      return dx;
    };
    const auto xd = to_double(x), wd = to_double(w), dyd = to_double(dy);
    std::vector<double> dxd(rows * D), dwd(D);
    kernels::rmsnorm_backward<double>(xd.data(), wd.data(), dyd.data(), dxd.data(), dwd.data(),
                                      rows, D, 1e-5);
    dxd.insert(dxd.end(), dwd.begin(), dwd.end());
    std::vector<float> r1, r2;
    with_threads(1, [&] { r1 = run(); });
    with_threads(2, [&] { r2 = run(); });
    expect_close(r2, dxd, 1e-4, 1e-4, "rmsnorm_backward float");
    EXPECT_TRUE(bitwise_equal(r1, r2));
    EXPECT_TRUE(bitwise_equal(run(), run()));
    // In double the dw sums are not rounded back to float, so an order change would show.
    auto run_double = [&, rows = rows, D = D] {
      std::vector<double> dx(rows * D), dw(D);
      kernels::rmsnorm_backward<double>(xd.data(), wd.data(), dyd.data(), dx.data(), dw.data(),
                                        rows, D, 1e-5);
      return dw;
    };
    std::vector<double> d1, d2, d3;
    with_threads(1, [&] { d1 = run_double(); });
    with_threads(2, [&] { d2 = run_double(); });
    with_threads(3, [&] { d3 = run_double(); });
    EXPECT_TRUE(bitwise_equal(d1, d2));
    EXPECT_TRUE(bitwise_equal(d2, d3));
  }
}
