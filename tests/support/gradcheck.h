#pragma once
// Central finite differences in float64 against the graph's reverse-mode gradients.
#include <cmath>
#include <functional>
#include <random>
#include <string>

#include <gtest/gtest.h>

#include "fusetune/graph/autodiff.h"
#include "fusetune/runtime/eager_executor.h"

namespace fusetune::testing {

inline Tensor random_tensor(const Shape& s, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  Tensor t = Tensor::empty(s, DType::F64);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = u(rng);
  return t;
}

// `g` must already hold the forward graph with output 0 = the scalar loss, trainable params
// bound in `params`. Appends the backward, checks every trainable param's gradient at up to
// `max_elems` elements per param. Returns the largest relative error seen.
inline double check_gradients(Graph& g, Value loss, TensorMap params, const TensorMap& inputs,
                              int max_elems = 12, double tol = 1e-6, double h = 1e-6) {
  auto grads = append_backward(g, loss);
  EagerExecutor ex(g);
  auto outs = ex.run(inputs, params);
  double worst = 0.0;
  EagerExecutor fwd(g);
  for (size_t gi = 0; gi < grads.size(); ++gi) {
    const std::string& name = grads[gi].first;
    const Tensor& analytic = outs[1 + gi];
    Tensor p = params.at(name);
    const int64_t n = p.numel();
    const int64_t step = std::max<int64_t>(1, n / max_elems);
    for (int64_t i = 0; i < n; i += step) {
      double* x = p.data<double>() + i;
      const double x0 = *x;
      *x = x0 + h;
      double lp = fwd.run(inputs, params)[0].data<double>()[0];
      *x = x0 - h;
      double lm = fwd.run(inputs, params)[0].data<double>()[0];
      *x = x0;
      double numeric = (lp - lm) / (2 * h);
      double a = analytic.data<double>()[i];
      double err = std::abs(a - numeric) / std::max(1.0, std::abs(numeric));
      worst = std::max(worst, err);
      EXPECT_LT(err, tol) << "param " << name << " element " << i << ": analytic " << a
                          << " numeric " << numeric;
    }
  }
  return worst;
}

}  // namespace fusetune::testing
