#pragma once
// Binds graph nodes to CPU kernels: runs one node given its input tensors and preallocated
// output tensors. Shared by the eager executor and the compiled plan executor.
#include <vector>

#include "fusetune/graph/graph.h"

namespace fusetune {

// Ops whose output is a view of their first input (no kernel, no allocation).
bool is_view_op(Op op);

// Whether the kernel bound to `n` stays correct when its output 0 is the same buffer as its
// input `input` (same byte size; the memory planner checks that and liveness): the op's
// OpDesc::in_place (graph/op_desc.h), audited in kernels/cpu: every output element is written
// only after every input element it depends on has been read (same-index elementwise loops, or
// row kernels that finish reading a row before writing it). Broadcast operands, reductions and
// multi-output kernels are not listed.
bool can_write_over_input(const Node& n, int input);

// Bytes a node's kernel may use for its temporaries (today the bf16 path's fp32 conversions):
// in a compiled step, a slice of the plan's arena reused by every node and step; empty in
// eager mode, where the kernel allocates what it needs for the node alone.
struct NodeScratch {
  char* data = nullptr;
  int64_t bytes = 0;
};

// Runs `n` in the graph's dtype: F32 and F64 directly, BF16 through bf16_node_kernels.h.
void run_node_kernel(const Graph& g, const Node& n, const std::vector<Tensor>& inputs,
                     std::vector<Tensor>& outputs, const NodeScratch& scratch = {});

// The fp32 kernels, for the BF16 path: floating inputs and outputs are F32 (except those
// kernel_reads_bf16 names).
void run_f32_node_kernel(const Node& n, const std::vector<Tensor>& inputs,
                         std::vector<Tensor>& outputs);

}  // namespace fusetune
