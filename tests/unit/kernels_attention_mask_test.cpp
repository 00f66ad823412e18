#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "fusetune/kernels/cpu/kernels.h"
#include "kernels_test_util.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace {
bool masked(const std::vector<int32_t>* doc, int64_t b, int64_t T, int64_t i, int64_t j) {
  return j > i || (doc != nullptr && (*doc)[b * T + i] != (*doc)[b * T + j]);
}
}  // namespace

TEST(KernelsAttentionMask, CausalAndDocumentMask) {
  for (auto [B, H, T] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1},
                         {2, 3, 5},
                         {2, 4, 67}}) {  // last: OpenMP path
    const auto scores = random_vec<float>(B * H * T * T, 1);
    std::vector<int32_t> doc(B * T);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < T; ++t) doc[b * T + t] = static_cast<int32_t>(t / (3 + b));
    }
    for (const std::vector<int32_t>* d : {static_cast<const std::vector<int32_t>*>(nullptr),
                                          static_cast<const std::vector<int32_t>*>(&doc)}) {
      std::vector<float> out(scores.size()), dx(scores.size());
      kernels::causal_mask<float>(scores.data(), d ? d->data() : nullptr, out.data(), B, H, T);
      kernels::causal_mask_backward<float>(scores.data(), d ? d->data() : nullptr, dx.data(), B, H,
                                           T);
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t h = 0; h < H; ++h) {
          for (int64_t i = 0; i < T; ++i) {
            for (int64_t j = 0; j < T; ++j) {
              const int64_t k = ((b * H + h) * T + i) * T + j;
              if (masked(d, b, T, i, j)) {
                ASSERT_EQ(out[k], -std::numeric_limits<float>::infinity()) << k;
                ASSERT_EQ(dx[k], 0.0f) << k;
              } else {
                ASSERT_EQ(out[k], scores[k]) << k;
                ASSERT_EQ(dx[k], scores[k]) << k;
              }
            }
          }
        }
      }
    }
  }
}

TEST(KernelsAttentionMask, BackwardMatchesFiniteDifferencesOnKeptEntries) {
  // The forward is the identity on kept entries and constant (-inf) on masked ones; test the
  // VJP through a finite function of it: mask, then softmax.
  const int64_t B = 1, H = 2, T = 4;
  const std::vector<int32_t> doc = {0, 0, 1, 1};
  const int64_t n = B * H * T * T;
  expect_vjp_matches_fd(
      random_vec(n, 2), n,
      [&](const std::vector<double>& s) {
        std::vector<double> m(n), y(n);
        kernels::causal_mask<double>(s.data(), doc.data(), m.data(), B, H, T);
        kernels::softmax_rows<double>(m.data(), y.data(), B * H * T, T);
        return y;
      },
      [&](const std::vector<double>& s, const std::vector<double>& dy) {
        std::vector<double> m(n), y(n), dm(n), ds(n);
        kernels::causal_mask<double>(s.data(), doc.data(), m.data(), B, H, T);
        kernels::softmax_rows<double>(m.data(), y.data(), B * H * T, T);
        kernels::softmax_backward<double>(y.data(), dy.data(), dm.data(), B * H * T, T);
        kernels::causal_mask_backward<double>(dm.data(), doc.data(), ds.data(), B, H, T);
        return ds;
      },
      "causal_mask");
}
