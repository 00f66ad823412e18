#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/util/error.h"
#include "kernels_test_util.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<double> ref_log_softmax(const std::vector<double>& x, int64_t rows, int64_t cols) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double m = -kInf;
    for (int64_t j = 0; j < cols; ++j) m = std::max(m, x[r * cols + j]);
    double s = 0.0;
    for (int64_t j = 0; j < cols; ++j) s += std::exp(x[r * cols + j] - m);
    for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = x[r * cols + j] - m - std::log(s);
  }
  return y;
}
}  // namespace

TEST(KernelsSoftmax, ForwardMatchesReference) {
  // Includes rows wide and many enough for the OpenMP path, and large logits (max-shift).
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{1, 1}, {3, 17}, {67, 3}, {5, 32003}, {600, 67}}) {
    const auto x = random_vec<float>(rows * cols, 1, -40.0, 60.0);
    const auto lp = ref_log_softmax(to_double(x), rows, cols);
    std::vector<double> p(lp.size());
    for (size_t i = 0; i < lp.size(); ++i) p[i] = std::exp(lp[i]);
    std::vector<float> ys(x.size()), yl(x.size());
    kernels::softmax_rows<float>(x.data(), ys.data(), rows, cols);
    kernels::log_softmax_rows<float>(x.data(), yl.data(), rows, cols);
    expect_close(ys, p, 1e-5, 1e-12, "softmax");
    expect_close(yl, lp, 1e-5, 1e-5, "log_softmax");
    std::vector<double> yd(x.size());
    const auto xd = to_double(x);
    kernels::log_softmax_rows<double>(xd.data(), yd.data(), rows, cols);
    expect_close(yd, lp, 1e-13, 1e-13, "log_softmax double");
  }
}

TEST(KernelsSoftmax, FullyMaskedRowGivesZerosNotNaN) {
  const float ninf = -std::numeric_limits<float>::infinity();
  const std::vector<float> x = {ninf, ninf, ninf, 0.0f, ninf, 0.0f};
  std::vector<float> y(6), l(6), dx(6);
  kernels::softmax_rows<float>(x.data(), y.data(), 2, 3);
  EXPECT_EQ(y, (std::vector<float>{0.0f, 0.0f, 0.0f, 0.5f, 0.0f, 0.5f}));
  kernels::log_softmax_rows<float>(x.data(), l.data(), 2, 3);
  for (int j = 0; j < 3; ++j) EXPECT_EQ(l[j], ninf);
  EXPECT_EQ(l[4], ninf);
  EXPECT_NEAR(l[3], -std::log(2.0f), 1e-7);
  const std::vector<float> dy = {1, 2, 3, 4, 5, 6};
  kernels::softmax_backward<float>(y.data(), dy.data(), dx.data(), 2, 3);
  for (float v : dx) EXPECT_FALSE(std::isnan(v));
  EXPECT_EQ(dx[0], 0.0f);
  kernels::log_softmax_backward<float>(l.data(), dy.data(), dx.data(), 2, 3);
  for (float v : dx) EXPECT_FALSE(std::isnan(v));
  EXPECT_EQ(dx[0], 1.0f);  // exp(-inf) = 0: dy passes through
}

TEST(KernelsSoftmax, BackwardsMatchFiniteDifferences) {
  const int64_t rows = 4, cols = 7;
  auto x = random_vec(rows * cols, 2, -3.0, 3.0);
  x[3] = -kInf;  // a masked entry inside a row
  expect_vjp_matches_fd(
      x, rows * cols,
      [&](const std::vector<double>& xs) {
        std::vector<double> y(xs.size());
        kernels::softmax_rows<double>(xs.data(), y.data(), rows, cols);
        return y;
      },
      [&](const std::vector<double>& xs, const std::vector<double>& dy) {
        std::vector<double> y(xs.size()), dx(xs.size());
        kernels::softmax_rows<double>(xs.data(), y.data(), rows, cols);
        kernels::softmax_backward<double>(y.data(), dy.data(), dx.data(), rows, cols);
        return dx;
      },
      "softmax");
  x[3] = 0.5;
  expect_vjp_matches_fd(
      x, rows * cols,
      [&](const std::vector<double>& xs) {
        std::vector<double> y(xs.size());
        kernels::log_softmax_rows<double>(xs.data(), y.data(), rows, cols);
        return y;
      },
      [&](const std::vector<double>& xs, const std::vector<double>& dy) {
        std::vector<double> y(xs.size()), dx(xs.size());
        kernels::log_softmax_rows<double>(xs.data(), y.data(), rows, cols);
        kernels::log_softmax_backward<double>(y.data(), dy.data(), dx.data(), rows, cols);
        return dx;
      },
      "log_softmax");
}

TEST(KernelsSoftmax, LargeFloatBackwardsMatchDoubleAndAreDeterministic) {
  const int64_t rows = 33, cols = 4099;
  const auto x = random_vec<float>(rows * cols, 3, -10.0, 10.0);
  const auto dy = random_vec<float>(rows * cols, 4);
  auto run = [&] {
    std::vector<float> y(x.size()), l(x.size()), d1(x.size()), d2(x.size());
    kernels::softmax_rows<float>(x.data(), y.data(), rows, cols);
    kernels::softmax_backward<float>(y.data(), dy.data(), d1.data(), rows, cols);
    kernels::log_softmax_rows<float>(x.data(), l.data(), rows, cols);
    kernels::log_softmax_backward<float>(l.data(), dy.data(), d2.data(), rows, cols);
    d1.insert(d1.end(), d2.begin(), d2.end());
    return d1;
  };
  const auto xd = to_double(x), dyd = to_double(dy);
  std::vector<double> y(x.size()), l(x.size()), d1(x.size()), d2(x.size());
  kernels::softmax_rows<double>(xd.data(), y.data(), rows, cols);
  kernels::softmax_backward<double>(y.data(), dyd.data(), d1.data(), rows, cols);
  kernels::log_softmax_rows<double>(xd.data(), l.data(), rows, cols);
  kernels::log_softmax_backward<double>(l.data(), dyd.data(), d2.data(), rows, cols);
  d1.insert(d1.end(), d2.begin(), d2.end());
  std::vector<float> r1, r2;
  with_threads(1, [&] { r1 = run(); });
  with_threads(2, [&] { r2 = run(); });
  expect_close(r2, d1, 1e-4, 1e-6, "softmax backwards float");
  EXPECT_TRUE(bitwise_equal(r1, r2));
  EXPECT_TRUE(bitwise_equal(run(), run()));
}

TEST(KernelsSoftmax, RejectsEmptyRows) {
  std::vector<float> x(1), y(1);
  EXPECT_THROW(kernels::softmax_rows<float>(x.data(), y.data(), 1, 0), Error);
}
