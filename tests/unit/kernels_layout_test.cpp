#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/util/error.h"
#include "kernels_test_util.h"

using namespace fusetune;
using namespace fusetune::testing;

TEST(KernelsLayout, TransposeSwapsAxes) {
  struct Shape {
    int64_t outer, d0, mid, d1, inner;
  };
  for (Shape s : {Shape{1, 1, 1, 1, 1}, Shape{2, 3, 1, 5, 4}, Shape{1, 17, 3, 1, 2},
                  Shape{3, 67, 1, 7, 1}, Shape{2, 129, 1, 8, 64}}) {  // last: [B,T,H,Dh]
    const int64_t n = s.outer * s.d0 * s.mid * s.d1 * s.inner;
    const auto x = random_vec<float>(n, 1);
    std::vector<float> out(n), back(n);
    kernels::transpose<float>(x.data(), out.data(), s.outer, s.d0, s.mid, s.d1, s.inner);
    for (int64_t o = 0; o < s.outer; ++o) {
      for (int64_t a0 = 0; a0 < s.d0; ++a0) {
        for (int64_t m = 0; m < s.mid; ++m) {
          for (int64_t a1 = 0; a1 < s.d1; ++a1) {
            for (int64_t i = 0; i < s.inner; ++i) {
              const int64_t src = (((o * s.d0 + a0) * s.mid + m) * s.d1 + a1) * s.inner + i;
              const int64_t dst = (((o * s.d1 + a1) * s.mid + m) * s.d0 + a0) * s.inner + i;
              ASSERT_EQ(out[dst], x[src]);
            }
          }
        }
      }
    }
    // Transposing back (d0 and d1 swapped) is the identity, and so is the VJP.
    kernels::transpose<float>(out.data(), back.data(), s.outer, s.d1, s.mid, s.d0, s.inner);
    EXPECT_TRUE(bitwise_equal(back, x));
  }
}

TEST(KernelsLayout, RepeatHeadsAndBackward) {
  for (auto [outer, kv, groups, inner] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 1, 1, 1},
        {2, 3, 4, 5},
        {2, 8, 4, 1024}}) {  // last: OpenMP path
    const auto x = random_vec<float>(outer * kv * inner, 1);
    std::vector<float> out(outer * kv * groups * inner);
    kernels::repeat_heads<float>(x.data(), out.data(), outer, kv, groups, inner);
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t h = 0; h < kv * groups; ++h) {
        for (int64_t i = 0; i < inner; ++i) {
          ASSERT_EQ(out[(o * kv * groups + h) * inner + i], x[(o * kv + h / groups) * inner + i]);
        }
      }
    }
    const auto dy = random_vec<float>(out.size(), 2);
    std::vector<float> dx(x.size());
    kernels::repeat_heads_backward<float>(dy.data(), dx.data(), outer, kv, groups, inner);
    std::vector<double> want(x.size(), 0.0);
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t h = 0; h < kv * groups; ++h) {
        for (int64_t i = 0; i < inner; ++i) {
          want[(o * kv + h / groups) * inner + i] += dy[(o * kv * groups + h) * inner + i];
        }
      }
    }
    expect_close(dx, want, 1e-6, 1e-6, "repeat_heads_backward");
  }
  const int64_t outer = 2, kv = 2, groups = 3, inner = 4;
  expect_vjp_matches_fd(
      random_vec(outer * kv * inner, 3), outer * kv * groups * inner,
      [&](const std::vector<double>& x) {
        std::vector<double> y(outer * kv * groups * inner);
        kernels::repeat_heads<double>(x.data(), y.data(), outer, kv, groups, inner);
        return y;
      },
      [&](const std::vector<double>&, const std::vector<double>& dy) {
        std::vector<double> dx(outer * kv * inner);
        kernels::repeat_heads_backward<double>(dy.data(), dx.data(), outer, kv, groups, inner);
        return dx;
      },
      "repeat_heads");
}

TEST(KernelsLayout, SliceAndBackward) {
  for (auto [outer, len, inner, start, n] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>{1, 1, 1, 0, 1},
        {3, 17, 5, 4, 9},
        {2, 67, 1, 66, 1},
        {4, 300, 64, 1, 299}}) {  // last: OpenMP path
    const auto x = random_vec<float>(outer * len * inner, 1);
    std::vector<float> out(outer * n * inner);
    kernels::slice<float>(x.data(), out.data(), outer, len, inner, start, n);
    std::vector<float> dx(x.size(), 5.0f);
    kernels::slice_backward<float>(out.data(), dx.data(), outer, len, inner, start, n);
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t l = 0; l < len; ++l) {
        for (int64_t i = 0; i < inner; ++i) {
          const int64_t k = (o * len + l) * inner + i;
          const bool in = l >= start && l < start + n;
          if (in) {
            ASSERT_EQ(out[(o * n + l - start) * inner + i], x[k]);
          }
          ASSERT_EQ(dx[k], in ? x[k] : 0.0f);
        }
      }
    }
  }
  const int64_t outer = 2, len = 5, inner = 3, start = 1, n = 3;
  expect_vjp_matches_fd(
      random_vec(outer * len * inner, 2), outer * n * inner,
      [&](const std::vector<double>& x) {
        std::vector<double> y(outer * n * inner);
        kernels::slice<double>(x.data(), y.data(), outer, len, inner, start, n);
        return y;
      },
      [&](const std::vector<double>&, const std::vector<double>& dy) {
        std::vector<double> dx(outer * len * inner);
        kernels::slice_backward<double>(dy.data(), dx.data(), outer, len, inner, start, n);
        return dx;
      },
      "slice");
}

TEST(KernelsLayout, SliceOutOfRangeIsAnError) {
  std::vector<float> x(10), out(10);
  try {
    kernels::slice<float>(x.data(), out.data(), 1, 10, 1, 8, 3);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[8, 11)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(kernels::slice_backward<float>(x.data(), out.data(), 1, 10, 1, -1, 2), Error);
  EXPECT_THROW(kernels::repeat_heads<float>(x.data(), out.data(), 1, 1, 0, 1), Error);
}
