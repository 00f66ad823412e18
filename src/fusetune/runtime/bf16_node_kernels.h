#pragma once
// Runs the nodes of a BF16 graph (dtype: bf16). bf16 is a storage format: every kernel computes
// in fp32. By default a node's bf16 inputs are widened into fp32 scratch, the fp32 kernel runs,
// and its bf16 outputs are rounded (to nearest even) from fp32 scratch; fp32 values (scalars,
// statistics: graph.h keeps_f32_in_bf16_graph) pass through untouched. The ops that read a
// weight never widen it whole (docs/design.md §6: "convert in GEMM tiles, never a whole fp32
// copy of a weight"):
//   - MatMul widens its weight operand a tile of rows at a time (kernels/cpu/bf16.h), and a
//     weight gradient (dW = dy^T x, the trans_a products) is produced a tile of rows at a time;
//   - Embedding copies bf16 rows straight into its bf16 output, and its backward sums each
//     id's rows in fp32 straight into the bf16 table gradient;
//   - the fused LM-head ops read a bf16 head tile by tile, like an NF4 head;
//   - pointwise ops (Add, Mul, Scale, SiLU, SwiGLU, fused elementwise programs) widen and round
//     per thread in small chunks, never a whole tensor.
// The fp32 scratch comes from the NodeScratch the executor passes: in a compiled step, a slice
// at the end of its arena (memory_plan.h), reused by every node and step (a fresh buffer costs
// a page fault per page on first touch, ~0.2 ms per MiB here); in eager mode, or for a node
// needing more than the slice holds, a counted buffer for the node alone.
#include <cstdint>
#include <vector>

#include "fusetune/graph/graph.h"
#include "fusetune/runtime/node_kernels.h"

namespace fusetune {

void run_bf16_node_kernel(const Graph& g, const Node& n, const std::vector<Tensor>& inputs,
                          std::vector<Tensor>& outputs, const NodeScratch& scratch);

// Whether the fp32 kernel bound to `n` reads input `input` as bf16 itself (the LM head of the
// fused ops), so it is not widened first.
bool kernel_reads_bf16(const Node& n, size_t input);

// Bytes of fp32 scratch the BF16 path adds to node `n` (widened inputs, fp32 outputs, tiles and
// chunk buffers, each padded to 64 bytes), on top of the fp32 kernel's own scratch: what
// run_bf16_node_kernel takes from its NodeScratch. The memory plan sizes the arena's scratch
// slice with it, and the memory estimate counts it.
int64_t bf16_conversion_scratch_bytes(const Graph& g, const Node& n);

}  // namespace fusetune
