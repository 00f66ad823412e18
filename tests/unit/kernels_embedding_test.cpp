#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/util/error.h"
#include "kernels_test_util.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace {
std::vector<int32_t> make_ids(int64_t n, int64_t V) {
  std::vector<int32_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((i * 31 + i / 3) % V);
  return ids;
}
}  // namespace

TEST(KernelsEmbedding, ForwardGathersRows) {
  for (auto [n, D, V] :
       {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {17, 3, 5}, {300, 67, 1000}}) {
    const auto table = random_vec<float>(V * D, 1);
    const auto ids = make_ids(n, V);
    std::vector<float> out(n * D);
    kernels::embedding_forward<float>(table.data(), ids.data(), out.data(), n, D, V);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < D; ++j) ASSERT_EQ(out[i * D + j], table[ids[i] * D + j]);
    }
  }
}

TEST(KernelsEmbedding, BackwardScatterAddsRepeatedIds) {
  // Wide D (several column blocks, OpenMP path) with ids repeated many times.
  for (auto [n, D, V] : {std::tuple<int64_t, int64_t, int64_t>{17, 3, 5}, {2000, 300, 37}}) {
    const auto dy = random_vec<float>(n * D, 2);
    const auto ids = make_ids(n, V);
    std::vector<double> want(V * D, 0.0);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < D; ++j) want[ids[i] * D + j] += dy[i * D + j];
    }
    // Bindings copied into the lambda: clang 14 cannot capture structured bindings.
    auto run = [&, n = n, D = D, V = V] {
      std::vector<float> dtable(V * D, 99.0f);  // overwritten, not accumulated
      kernels::embedding_backward<float>(dy.data(), ids.data(), dtable.data(), n, D, V);
      return dtable;
    };
    std::vector<float> r1, r2;
    with_threads(1, [&] { r1 = run(); });
    with_threads(2, [&] { r2 = run(); });
    expect_close(r2, want, 1e-5, 1e-4, "embedding_backward");
    EXPECT_TRUE(bitwise_equal(r1, r2));
    EXPECT_TRUE(bitwise_equal(run(), run()));
  }
}

TEST(KernelsEmbedding, BackwardMatchesFiniteDifferences) {
  const int64_t n = 6, D = 3, V = 4;
  const std::vector<int32_t> ids = {1, 3, 1, 0, 1, 3};
  expect_vjp_matches_fd(
      random_vec(V * D, 3), n * D,
      [&](const std::vector<double>& table) {
        std::vector<double> out(n * D);
        kernels::embedding_forward<double>(table.data(), ids.data(), out.data(), n, D, V);
        return out;
      },
      [&](const std::vector<double>&, const std::vector<double>& dy) {
        std::vector<double> dtable(V * D);
        kernels::embedding_backward<double>(dy.data(), ids.data(), dtable.data(), n, D, V);
        return dtable;
      },
      "embedding");
}

TEST(KernelsEmbedding, OutOfRangeIdNamesIdAndVocab) {
  const std::vector<float> table(4 * 2, 1.0f);
  std::vector<float> out(3 * 2);
  for (int32_t bad : {4, -1}) {
    const std::vector<int32_t> ids = {0, bad, 1};
    try {
      kernels::embedding_forward<float>(table.data(), ids.data(), out.data(), 3, 2, 4);
      FAIL() << "expected an error for id " << bad;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("id " + std::to_string(bad)), std::string::npos) << msg;
      EXPECT_NE(msg.find("size 4"), std::string::npos) << msg;
    }
    std::vector<float> dtable(8);
    EXPECT_THROW(kernels::embedding_backward<float>(out.data(), ids.data(), dtable.data(), 3, 2, 4),
                 Error);
  }
}
