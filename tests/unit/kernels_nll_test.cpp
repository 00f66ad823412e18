#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/util/error.h"
#include "kernels_test_util.h"

using namespace fusetune;
using namespace fusetune::testing;

TEST(KernelsNll, SumIgnoresMinus100) {
  const int64_t rows = 67, V = 17;
  const auto logp = random_vec<float>(rows * V, 1, -10.0, 0.0);
  std::vector<int32_t> labels(rows);
  double want = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    labels[r] = r % 5 == 0 ? -100 : static_cast<int32_t>((r * 7) % V);
    if (labels[r] != -100) want -= logp[r * V + labels[r]];
  }
  EXPECT_NEAR(kernels::nll_sum<float>(logp.data(), labels.data(), rows, V), want, 1e-9);
  const std::vector<int32_t> all_ignored(rows, -100);
  EXPECT_EQ(kernels::nll_sum<float>(logp.data(), all_ignored.data(), rows, V), 0.0);
}

TEST(KernelsNll, BackwardIsDenseOneHot) {
  for (auto [rows, V] : {std::pair<int64_t, int64_t>{3, 5}, {130, 1001}}) {  // 2nd: OpenMP path
    std::vector<int32_t> labels(rows);
    for (int64_t r = 0; r < rows; ++r) labels[r] = r % 3 == 1 ? -100 : static_cast<int32_t>(r % V);
    std::vector<double> dx(rows * V, 7.0);  // overwritten everywhere
    kernels::nll_backward<double>(0.25, labels.data(), dx.data(), rows, V);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < V; ++j) {
        const double want = (labels[r] == j) ? -0.25 : 0.0;
        ASSERT_EQ(dx[r * V + j], want) << "row " << r << " col " << j;
      }
    }
  }
}

TEST(KernelsNll, BackwardMatchesFiniteDifferences) {
  const int64_t rows = 4, V = 6;
  const std::vector<int32_t> labels = {2, -100, 5, 0};
  expect_vjp_matches_fd(
      random_vec(rows * V, 2, -5.0, 0.0), 1,
      [&](const std::vector<double>& lp) {
        return std::vector<double>{kernels::nll_sum<double>(lp.data(), labels.data(), rows, V)};
      },
      [&](const std::vector<double>&, const std::vector<double>& dy) {
        std::vector<double> dx(rows * V);
        kernels::nll_backward<double>(dy[0], labels.data(), dx.data(), rows, V);
        return dx;
      },
      "nll");
}

TEST(KernelsNll, BadLabelNamesLabelAndRow) {
  const std::vector<float> logp(3 * 4, -1.0f);
  for (int32_t bad : {4, -1, -99, 1000000}) {
    const std::vector<int32_t> labels = {0, -100, bad};
    try {
      kernels::nll_sum<float>(logp.data(), labels.data(), 3, 4);
      FAIL() << "expected an error for label " << bad;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("label " + std::to_string(bad) + " at row 2"), std::string::npos) << msg;
    }
    std::vector<float> dx(12);
    EXPECT_THROW(kernels::nll_backward<float>(1.0f, labels.data(), dx.data(), 3, 4), Error);
  }
}
