#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/util/error.h"
#include "kernels_test_util.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace {
struct Tables {
  std::vector<double> cos, sin;
};
// Llama tables: inv_freq[i] = theta^(-2i/Dh), angle = pos * inv_freq[i].
Tables make_tables(int64_t max_pos, int64_t Dh, double theta = 10000.0) {
  Tables t;
  for (int64_t p = 0; p < max_pos; ++p) {
    for (int64_t i = 0; i < Dh / 2; ++i) {
      const double a = p * std::pow(theta, -2.0 * i / Dh);
      t.cos.push_back(std::cos(a));
      t.sin.push_back(std::sin(a));
    }
  }
  return t;
}

// Hugging Face apply_rotary_pos_emb: x * cos_full + rotate_half(x) * sin_full.
std::vector<double> ref_rope(const std::vector<double>& x, const Tables& t,
                             const std::vector<int32_t>& pos, int64_t B, int64_t T, int64_t H,
                             int64_t Dh) {
  const int64_t half = Dh / 2;
  std::vector<double> out(x.size());
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t s = 0; s < T; ++s) {
      const int64_t p = pos[b * T + s];
      for (int64_t h = 0; h < H; ++h) {
        const double* xr = x.data() + ((b * T + s) * H + h) * Dh;
        double* o = out.data() + ((b * T + s) * H + h) * Dh;
        for (int64_t d = 0; d < Dh; ++d) {
          const int64_t i = d % half;
          const double rot = d < half ? -xr[d + half] : xr[d - half];
          o[d] = xr[d] * t.cos[p * half + i] + rot * t.sin[p * half + i];
        }
      }
    }
  }
  return out;
}
}  // namespace

TEST(KernelsRope, MatchesHuggingFaceRotateHalf) {
  for (auto [B, T, H, Dh] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 1, 1, 2},
                             {2, 3, 3, 6},
                             {1, 17, 5, 34},
                             {2, 67, 4, 128}}) {
    const int64_t max_pos = 3 * T + 5;
    const auto tab = make_tables(max_pos, Dh);
    std::vector<int32_t> pos(B * T);
    for (int64_t i = 0; i < B * T; ++i) pos[i] = static_cast<int32_t>((i * 7 + 3) % max_pos);
    const auto x = random_vec(B * T * H * Dh, 1);
    const auto want = ref_rope(x, tab, pos, B, T, H, Dh);
    std::vector<double> out(x.size());
    kernels::rope<double>(x.data(), tab.cos.data(), tab.sin.data(), pos.data(), out.data(), B, T, H,
                          Dh, false);
    expect_close(out, want, 1e-14, 1e-14, "rope double");
    // float, in place.
    std::vector<float> xf(x.begin(), x.end());
    const std::vector<float> cf(tab.cos.begin(), tab.cos.end()), sf(tab.sin.begin(), tab.sin.end());
    kernels::rope<float>(xf.data(), cf.data(), sf.data(), pos.data(), xf.data(), B, T, H, Dh,
                         false);
    expect_close(xf, want, 1e-6, 1e-6, "rope float in place");
    // inverse undoes forward.
    std::vector<double> back(x.size());
    kernels::rope<double>(out.data(), tab.cos.data(), tab.sin.data(), pos.data(), back.data(), B, T,
                          H, Dh, true);
    expect_close(back, x, 1e-14, 1e-14, "rope inverse");
  }
}

TEST(KernelsRope, InverseIsTheVjp) {
  const int64_t B = 2, T = 3, H = 2, Dh = 8, max_pos = 11;
  const auto tab = make_tables(max_pos, Dh);
  const std::vector<int32_t> pos = {0, 4, 10, 7, 1, 2};
  expect_vjp_matches_fd(
      random_vec(B * T * H * Dh, 2), B * T * H * Dh,
      [&](const std::vector<double>& xs) {
        std::vector<double> y(xs.size());
        kernels::rope<double>(xs.data(), tab.cos.data(), tab.sin.data(), pos.data(), y.data(), B, T,
                              H, Dh, false);
        return y;
      },
      [&](const std::vector<double>&, const std::vector<double>& dy) {
        std::vector<double> dx(dy.size());
        kernels::rope<double>(dy.data(), tab.cos.data(), tab.sin.data(), pos.data(), dx.data(), B,
                              T, H, Dh, true);
        return dx;
      },
      "rope");
}

TEST(KernelsRope, LargeFloatMatchesDouble) {
  const int64_t B = 2, T = 128, H = 8, Dh = 64, max_pos = 256;  // past the OpenMP threshold
  const auto tab = make_tables(max_pos, Dh, 500000.0);
  std::vector<int32_t> pos(B * T);
  for (int64_t i = 0; i < B * T; ++i) pos[i] = static_cast<int32_t>(i % T);
  const auto x = random_vec(B * T * H * Dh, 3);
  const auto want = ref_rope(x, tab, pos, B, T, H, Dh);
  const std::vector<float> xf(x.begin(), x.end()), cf(tab.cos.begin(), tab.cos.end()),
      sf(tab.sin.begin(), tab.sin.end());
  std::vector<float> out(x.size());
  kernels::rope<float>(xf.data(), cf.data(), sf.data(), pos.data(), out.data(), B, T, H, Dh, false);
  expect_close(out, want, 1e-6, 1e-6, "rope large");
}

TEST(KernelsRope, BadPositionsAndOddHeadDim) {
  const auto tab = make_tables(4, 4);
  std::vector<double> x(8), out(8);
  const std::vector<int32_t> neg = {0, -3};
  try {
    kernels::rope<double>(x.data(), tab.cos.data(), tab.sin.data(), neg.data(), out.data(), 1, 2, 1,
                          4, false);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("-3"), std::string::npos) << e.what();
  }
  const std::vector<int32_t> big = {1, 4};
  try {
    kernels::check_rope_positions(big.data(), 2, 4);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("position 4 at index 1"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(kernels::check_rope_positions(neg.data(), 1, 4));
  EXPECT_THROW(kernels::rope<double>(x.data(), tab.cos.data(), tab.sin.data(), big.data(),
                                     out.data(), 1, 1, 1, 3, false),
               Error);
}
