#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "fusetune/optim/sgd.h"
#include "fusetune/util/error.h"

using namespace fusetune;

namespace {

const std::vector<double> kSgdP0 = {0.5, -1.25, 2.0, 0.0};
const std::vector<std::vector<double>> kSgdGrads = {
    {0.3, -0.2, 0.0, 1.5}, {-0.1, -0.4, 0.25, 1.0}, {0.05, 0.6, -0.3, -2.0}};
const std::vector<double> kSgdLrs = {0.1, 0.05, 0.02};

// torch.optim.SGD's documented algorithm, in double.
std::vector<double> reference_sgd(const SGDOptions& o, int steps) {
  std::vector<double> p = kSgdP0, buf(p.size(), 0.0);
  for (int k = 0; k < steps; ++k) {
    for (size_t i = 0; i < p.size(); ++i) {
      double g = kSgdGrads[k][i] + o.weight_decay * p[i];
      if (o.momentum != 0) {
        buf[i] = k == 0 ? g : o.momentum * buf[i] + (1 - o.dampening) * g;
        g = o.nesterov ? g + o.momentum * buf[i] : buf[i];
      }
      p[i] -= kSgdLrs[k] * g;
    }
  }
  return p;
}

template <class T>
std::vector<double> run_sgd(const SGDOptions& o, int steps, int64_t* state_bytes = nullptr) {
  const int64_t n = int64_t(kSgdP0.size());
  Tensor p = Tensor::empty({n}, dtype_of<T>()), g = Tensor::empty({n}, dtype_of<T>());
  for (int64_t i = 0; i < n; ++i) p.data<T>()[i] = T(kSgdP0[i]);
  std::vector<ParamRef> params = {{"w", &p, &g}};
  SGD opt(o);
  for (int k = 0; k < steps; ++k) {
    for (int64_t i = 0; i < n; ++i) g.data<T>()[i] = T(kSgdGrads[k][i]);
    opt.step(params, kSgdLrs[k]);
  }
  if (state_bytes) *state_bytes = opt.state_bytes();
  std::vector<double> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(p.data<T>()[i]);
  return out;
}

void expect_matches(const SGDOptions& o) {
  const auto expected = reference_sgd(o, 3);
  const auto got64 = run_sgd<double>(o, 3);
  const auto got32 = run_sgd<float>(o, 3);
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(got64[i], expected[i], 1e-14) << i;
    EXPECT_NEAR(got32[i], expected[i], 1e-6) << i;
  }
}

}  // namespace

TEST(OptimSGD, MomentumWithWeightDecayMatchesReference) {
  SGDOptions o;
  o.momentum = 0.9;
  o.weight_decay = 0.01;
  expect_matches(o);
  // Hand-checked first element: step 1: d = 0.3 + 0.005 = 0.305, p = 0.5 - 0.0305 = 0.4695.
  EXPECT_NEAR(run_sgd<double>(o, 1)[0], 0.4695, 1e-15);
  // step 2: d = -0.1 + 0.004695 = -0.095305, buf = 0.9*0.305 - 0.095305 = 0.179195,
  // p = 0.4695 - 0.05*0.179195 = 0.46054025.
  EXPECT_NEAR(run_sgd<double>(o, 2)[0], 0.46054025, 1e-15);
}

TEST(OptimSGD, PlainNesterovAndDampening) {
  expect_matches(SGDOptions{});
  SGDOptions nesterov;
  nesterov.momentum = 0.8;
  nesterov.nesterov = true;
  expect_matches(nesterov);
  SGDOptions damp;
  damp.momentum = 0.5;
  damp.dampening = 0.3;
  expect_matches(damp);
}

TEST(OptimSGD, NoStateWithoutMomentum) {
  int64_t bytes = -1;
  run_sgd<float>(SGDOptions{}, 2, &bytes);
  EXPECT_EQ(bytes, 0);
  SGDOptions o;
  o.momentum = 0.9;
  run_sgd<float>(o, 2, &bytes);
  EXPECT_EQ(bytes, int64_t(kSgdP0.size() * 4));
}

TEST(OptimSGD, RejectsInvalidOptions) {
  SGDOptions o;
  o.nesterov = true;  // needs momentum
  EXPECT_THROW(SGD{o}, Error);
  o.momentum = 0.9;
  o.dampening = 0.1;  // nesterov needs zero dampening
  EXPECT_THROW(SGD{o}, Error);
  SGDOptions neg;
  neg.momentum = -0.5;
  EXPECT_THROW(SGD{neg}, Error);
}
