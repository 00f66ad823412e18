#pragma once
// Binds graph nodes to CPU kernels: runs one node given its input tensors and preallocated
// output tensors. Shared by the eager executor and the compiled plan executor.
#include <vector>

#include "fusetune/graph/graph.h"

namespace fusetune {

// Ops whose output is a view of their first input (no kernel, no allocation).
bool is_view_op(Op op);

void run_node_kernel(const Graph& g, const Node& n, const std::vector<Tensor>& inputs,
                     std::vector<Tensor>& outputs);

}  // namespace fusetune
