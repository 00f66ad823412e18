#include "gradcheck.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "fusetune/graph/autodiff.h"
#include "fusetune/runtime/eager_executor.h"

namespace fusetune::testing {

double check_gradients(Graph& g, Value loss, TensorMap params, const TensorMap& inputs,
                       int max_elems, double tol, double h) {
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
