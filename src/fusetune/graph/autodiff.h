#pragma once
// Reverse-mode autodiff over the graph: every forward op has a VJP rule that emits graph ops.
// Gradients flow only to values that depend on a trainable parameter, so frozen weights (a
// LoRA base, say) get no dW and no work is spent on them.
#include <string>
#include <utility>
#include <vector>

#include "fusetune/graph/graph.h"

namespace fusetune {

// Appends the backward of the scalar `loss` to `g`. Returns (param name, gradient value) for
// every trainable parameter the loss depends on, in parameter order, and marks each as a
// graph output named "grad:<param name>".
std::vector<std::pair<std::string, Value>> append_backward(Graph& g, Value loss);

}  // namespace fusetune
