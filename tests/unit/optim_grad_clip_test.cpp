#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "fusetune/optim/grad_clip.h"
#include "fusetune/util/error.h"

using namespace fusetune;

namespace {

Tensor vec(const std::vector<float>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::F32);
  for (size_t i = 0; i < v.size(); ++i) t.data<float>()[i] = v[i];
  return t;
}

}  // namespace

TEST(OptimGradClip, NormAndScaling) {
  // Norm over both tensors together: sqrt(9 + 16 + 144) = 13.
  Tensor p1 = vec({0, 0}), g1 = vec({3, 4});
  Tensor p2 = vec({0}), g2 = vec({12});
  std::vector<ParamRef> params = {{"a", &p1, &g1}, {"b", &p2, &g2}};
  EXPECT_EQ(grad_norm(params), 13.0);
  const double norm = clip_grad_norm(params, 1.0);
  EXPECT_EQ(norm, 13.0);  // the norm before clipping
  const float coef = float(1.0 / (13.0 + 1e-6));
  EXPECT_EQ(g1.data<float>()[0], 3.0f * coef);
  EXPECT_EQ(g1.data<float>()[1], 4.0f * coef);
  EXPECT_EQ(g2.data<float>()[0], 12.0f * coef);
  EXPECT_NEAR(grad_norm(params), 1.0, 1e-6);
}

TEST(OptimGradClip, NoScalingAtOrBelowMaxNorm) {
  Tensor p = vec({0, 0}), g = vec({3, 4});
  std::vector<ParamRef> params = {{"a", &p, &g}};
  EXPECT_EQ(clip_grad_norm(params, 10.0), 5.0);
  EXPECT_EQ(g.data<float>()[0], 3.0f);
  EXPECT_EQ(g.data<float>()[1], 4.0f);
  // max_norm == norm: coef = 5 / (5 + 1e-6) < 1, so torch does scale (by ~1 - 2e-7).
  clip_grad_norm(params, 5.0);
  EXPECT_LE(g.data<float>()[1], 4.0f);
  EXPECT_NEAR(g.data<float>()[1], 4.0f, 1e-5);
}

TEST(OptimGradClip, F64AndMissingGrads) {
  Tensor p = Tensor::zeros({2}, DType::F64), g = Tensor::empty({2}, DType::F64);
  g.data<double>()[0] = 6;
  g.data<double>()[1] = 8;
  Tensor q = vec({1});
  std::vector<ParamRef> params = {{"a", &p, &g}, {"frozen_ish", &q, nullptr}};
  EXPECT_EQ(clip_grad_norm(params, 5.0), 10.0);
  EXPECT_DOUBLE_EQ(g.data<double>()[0], 6 * (5.0 / (10.0 + 1e-6)));
}

TEST(OptimGradClip, NonFiniteNormIsReturnedAndGradsLeftAlone) {
  Tensor p = vec({0, 0, 0}), g = vec({1, std::numeric_limits<float>::infinity(), 2});
  std::vector<ParamRef> params = {{"a", &p, &g}};
  EXPECT_TRUE(std::isinf(clip_grad_norm(params, 1.0)));
  EXPECT_EQ(g.data<float>()[0], 1.0f);
  EXPECT_EQ(g.data<float>()[2], 2.0f);
  g.data<float>()[1] = std::nanf("");
  EXPECT_TRUE(std::isnan(clip_grad_norm(params, 1.0)));
  EXPECT_EQ(g.data<float>()[0], 1.0f);
}

TEST(OptimGradClip, DeterministicAcrossThreadCounts) {
  const int64_t n = 300001;  // many blocks, parallel path
  Tensor p = Tensor::zeros({n}, DType::F32), g = Tensor::empty({n}, DType::F32);
  for (int64_t i = 0; i < n; ++i) g.data<float>()[i] = std::sin(float(i) * 0.01f) * 1e-3f;
  std::vector<ParamRef> params = {{"a", &p, &g}};
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const double one = grad_norm(params);
  omp_set_num_threads(3);
  const double three = grad_norm(params);
  omp_set_num_threads(saved);
  EXPECT_EQ(std::memcmp(&one, &three, sizeof one), 0);
  double ref = 0;
  for (int64_t i = 0; i < n; ++i) ref += double(g.data<float>()[i]) * g.data<float>()[i];
  EXPECT_NEAR(one, std::sqrt(ref), 1e-12 * std::sqrt(ref));
}

TEST(OptimGradClip, RejectsBadArguments) {
  Tensor p = vec({0, 0}), g = vec({3});
  std::vector<ParamRef> params = {{"a", &p, &g}};
  EXPECT_THROW(clip_grad_norm(params, 1.0), Error);  // grad shape mismatch
  Tensor g2 = vec({3, 4});
  std::vector<ParamRef> ok = {{"a", &p, &g2}};
  EXPECT_THROW(clip_grad_norm(ok, 0.0), Error);
  EXPECT_THROW(clip_grad_norm(ok, -1.0), Error);
  EXPECT_THROW(clip_grad_norm(ok, std::nan("")), Error);
}
