#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "fusetune/core/memory.h"
#include "fusetune/optim/adamw.h"
#include "fusetune/util/error.h"

using namespace fusetune;

namespace {

template <class T>
Tensor make(const std::vector<double>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, dtype_of<T>());
  for (size_t i = 0; i < v.size(); ++i) t.data<T>()[i] = T(v[i]);
  return t;
}

template <class T>
void set(Tensor& t, const std::vector<double>& v) {
  for (size_t i = 0; i < v.size(); ++i) t.data<T>()[i] = T(v[i]);
}

const std::vector<double> kP0 = {0.5, -1.25, 2.0, 0.0, -0.1};
const std::vector<std::vector<double>> kGrads = {
    {0.3, -0.2, 0.0, 1.5, -0.01}, {-0.1, -0.4, 0.25, 1.0, 0.02}, {0.05, 0.6, -0.3, -2.0, 0.0}};
const std::vector<double> kLrs = {0.1, 0.05, 0.02};  // a schedule: lr differs per step

// The textbook AdamW (decoupled decay, bias-corrected moments), written independently of the
// implementation, in double.
std::vector<double> reference_adamw(const AdamWOptions& o, int steps) {
  std::vector<double> p = kP0, m(p.size(), 0.0), v(p.size(), 0.0);
  for (int k = 0; k < steps; ++k) {
    const double lr = kLrs[k];
    const int t = k + 1;
    const double bc1 = 1 - std::pow(o.beta1, t), bc2 = 1 - std::pow(o.beta2, t);
    for (size_t i = 0; i < p.size(); ++i) {
      const double g = kGrads[k][i];
      p[i] -= lr * o.weight_decay * p[i];
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g;
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g * g;
      const double denom = std::sqrt(v[i]) / std::sqrt(bc2) + o.eps;
      p[i] -= (lr / bc1) * m[i] / denom;
    }
  }
  return p;
}

template <class T>
std::vector<double> run_adamw(const AdamWOptions& o, int steps) {
  Tensor p = make<T>(kP0);
  Tensor g = Tensor::zeros({int64_t(kP0.size())}, dtype_of<T>());
  std::vector<ParamRef> params = {{"w", &p, &g}};
  AdamW opt(o);
  for (int k = 0; k < steps; ++k) {
    set<T>(g, kGrads[k]);
    opt.step(params, kLrs[k]);
  }
  EXPECT_EQ(opt.step_count("w"), steps);
  std::vector<double> out;
  for (int64_t i = 0; i < p.numel(); ++i) out.push_back(p.data<T>()[i]);
  return out;
}

}  // namespace

TEST(OptimAdamW, ThreeStepsMatchReferenceF64) {
  AdamWOptions o;
  o.weight_decay = 0.1;
  const auto expected = reference_adamw(o, 3);
  const auto got = run_adamw<double>(o, 3);
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-13) << i;
}

TEST(OptimAdamW, ThreeStepsMatchReferenceF32) {
  AdamWOptions o;
  o.weight_decay = 0.1;
  o.beta1 = 0.8;
  o.beta2 = 0.99;
  o.eps = 1e-6;
  const auto expected = reference_adamw(o, 3);
  const auto got = run_adamw<float>(o, 3);
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(got[i], expected[i], 2e-6) << i;
}

TEST(OptimAdamW, FirstStepIsSignStepAfterDecay) {
  // Bias correction makes step 1 move each weight by ~lr * sign(g) (m/sqrt(v) = sign(g));
  // a zero gradient moves it only by the weight decay.
  AdamWOptions o;
  o.weight_decay = 0.1;
  const auto got = run_adamw<double>(o, 1);
  for (size_t i = 0; i < kP0.size(); ++i) {
    const double g = kGrads[0][i];
    const double decayed = kP0[i] * (1 - kLrs[0] * o.weight_decay);
    const double sign = g > 0 ? 1 : g < 0 ? -1 : 0;
    EXPECT_NEAR(got[i], decayed - kLrs[0] * sign, 1e-6) << i;
  }
}

TEST(OptimAdamW, WeightDecayDefaultAndZero) {
  EXPECT_EQ(AdamWOptions{}.weight_decay, 0.01);
  AdamWOptions o;
  o.weight_decay = 0;
  const auto got = run_adamw<double>(o, 3);
  const auto expected = reference_adamw(o, 3);
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-13);
  AdamWOptions decayed;
  decayed.weight_decay = 0.1;
  EXPECT_NE(run_adamw<double>(decayed, 3)[0], got[0]);  // the decay does change the result
}

TEST(OptimAdamW, StateIsAllocatedLazilyAndCounted) {
  Tensor p = Tensor::zeros({1000}, DType::F32);
  Tensor g = Tensor::zeros({1000}, DType::F32);
  std::vector<ParamRef> params = {{"w", &p, &g}};
  const int64_t before = memory::current_bytes();
  AdamW opt;
  EXPECT_EQ(memory::current_bytes(), before);
  EXPECT_EQ(opt.state_bytes(), 0);
  opt.step(params, 1e-3);
  EXPECT_EQ(memory::current_bytes() - before, 2 * 1000 * 4);
  EXPECT_EQ(opt.state_bytes(), 2 * 1000 * 4);
  opt.step(params, 1e-3);
  EXPECT_EQ(memory::current_bytes() - before, 2 * 1000 * 4);
}

TEST(OptimAdamW, ParamWithoutGradIsSkipped) {
  Tensor p = make<float>({1, 2});
  Tensor q = make<float>({3, 4});
  Tensor gq = make<float>({0.5, 0.5});
  std::vector<ParamRef> params = {{"p", &p, nullptr}, {"q", &q, &gq}};
  AdamW opt;
  opt.step(params, 0.1);
  EXPECT_EQ(p.data<float>()[0], 1.0f);
  EXPECT_EQ(p.data<float>()[1], 2.0f);
  EXPECT_EQ(opt.step_count("p"), 0);
  EXPECT_EQ(opt.step_count("q"), 1);
  EXPECT_LT(q.data<float>()[0], 3.0f);
}

TEST(OptimAdamW, SameResultForAnyThreadCount) {
  const int64_t n = 100000;  // above the parallel threshold
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    Tensor p = Tensor::empty({n}, DType::F32), g = Tensor::empty({n}, DType::F32);
    for (int64_t i = 0; i < n; ++i) {
      p.data<float>()[i] = std::sin(float(i));
      g.data<float>()[i] = std::cos(float(i) * 0.37f);
    }
    std::vector<ParamRef> params = {{"w", &p, &g}};
    AdamW opt;
    for (int k = 0; k < 3; ++k) opt.step(params, 1e-2);
    return p;
  };
  const int saved = omp_get_max_threads();
  Tensor a = run(1), b = run(4);
  omp_set_num_threads(saved);
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
}

TEST(OptimAdamW, RejectsBadInput) {
  EXPECT_THROW(AdamW(AdamWOptions{1.0, 0.999, 1e-8, 0.01}), Error);
  EXPECT_THROW(AdamW(AdamWOptions{0.9, -0.1, 1e-8, 0.01}), Error);
  EXPECT_THROW(AdamW(AdamWOptions{0.9, 0.999, -1, 0.01}), Error);
  EXPECT_THROW(AdamW(AdamWOptions{0.9, 0.999, 1e-8, -0.01}), Error);

  AdamW opt;
  Tensor p = make<float>({1, 2});
  Tensor g_short = make<float>({1});
  Tensor g64 = make<double>({1, 2});
  Tensor g = make<float>({1, 2});
  Tensor ph = Tensor::zeros({2}, DType::F16);  // BF16 trains (optim_bf16_test.cpp), F16 not
  std::vector<ParamRef> bad_shape = {{"w", &p, &g_short}};
  std::vector<ParamRef> bad_dtype = {{"w", &p, &g64}};
  std::vector<ParamRef> dup = {{"w", &p, &g}, {"w", &p, &g}};
  std::vector<ParamRef> f16 = {{"w", &ph, &ph}};
  std::vector<ParamRef> good = {{"w", &p, &g}};
  try {
    opt.step(bad_shape, 0.1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[1]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(opt.step(bad_dtype, 0.1), Error);
  EXPECT_THROW(opt.step(dup, 0.1), Error);
  EXPECT_THROW(opt.step(f16, 0.1), Error);
  EXPECT_THROW(opt.step(good, -1.0), Error);
  EXPECT_THROW(opt.step(good, std::nan("")), Error);
  EXPECT_EQ(p.data<float>()[0], 1.0f);  // nothing was applied
  EXPECT_EQ(opt.step_count("w"), 0);

  // A parameter whose shape changes under the same name is reported, not misread.
  opt.step(good, 0.1);
  Tensor p3 = make<float>({1, 2, 3}), g3 = make<float>({1, 2, 3});
  std::vector<ParamRef> changed = {{"w", &p3, &g3}};
  EXPECT_THROW(opt.step(changed, 0.1), Error);
}
