#pragma once
// Central finite differences in float64 against the graph's reverse-mode gradients.
#include "fusetune/graph/autodiff.h"
#include "fusetune/runtime/eager_executor.h"
#include "tensor_checks.h"

namespace fusetune::testing {

// `g` must already hold the forward graph with output 0 = the scalar loss, trainable params
// bound in `params`. Appends the backward, checks every trainable param's gradient at up to
// `max_elems` elements per param. Returns the largest relative error seen.
double check_gradients(Graph& g, Value loss, TensorMap params, const TensorMap& inputs,
                       int max_elems = 12, double tol = 1e-6, double h = 1e-6);

}  // namespace fusetune::testing
