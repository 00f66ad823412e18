#pragma once
// Memory planning (docs/design.md §5): liveness over the scheduled nodes, then every intermediate
// buffer gets an offset in one arena, placed greedily by size so buffers whose lifetimes
// overlap never share bytes. Leaves, graph outputs and views are not placed: leaves are bound
// by the caller, outputs outlive the step, views alias their source (whose lifetime they
// extend). With `dynamic_region` >= 0, nodes of that region are left to the eager allocator,
// as an uncompiled loss runs in PyTorch.
//
// In place: a node whose kernel may write its output over an input (can_write_over_input in
// runtime/node_kernels.h) reuses that input's buffer when the node is the input's last reader
// (through any view) and the sizes are equal. Leaves, graph outputs and unplaced buffers are
// never written over: they are not in the arena. Joining lifetimes can make the greedy
// placement fragment, so the in-place plan is kept only when its arena is no larger than the
// plan without it.
//
// The arena ends with one scratch slice for the nodes' kernel temporaries
// (bf16_conversion_scratch_bytes: a bf16 step's fp32 conversions), which every node reuses:
// planned once, it costs no allocation and no page faults per node. It is as large as the
// largest need up to kScratchSliceCap; a node needing more (a bf16 full fine-tune's LM-head
// gradient, computed in fp32: 1 GiB at Llama 3.2 1B) allocates its own for its duration, as in
// eager mode, so the slice adds at most the cap to the step's peak.
//
// The plan it returns (MemoryPlan) is declared in runtime/memory_plan.h, with the executor that
// runs and owns it; this file is the pass that computes it.
#include <cstdint>
#include <vector>

#include "fusetune/graph/graph.h"
#include "fusetune/runtime/memory_plan.h"

namespace fusetune {

inline constexpr int64_t kScratchSliceCap = int64_t(64) << 20;

// `in_place` = false plans every buffer on its own (for comparison and tests).
MemoryPlan plan_memory(const Graph& g, int dynamic_region = -1, bool in_place = true);

// Per node, the index of the last node that reads it or any view of it (INT_MAX for graph
// outputs and the views/sources of graph outputs).
std::vector<int> last_uses(const Graph& g);

// optimizer_in_bwd: per graph output, true when it is a "grad:<param>" output that no node
// scheduled after it reads the parameter (directly or through a view) of, so the parameter may
// be updated as soon as the output is computed, and whose buffer no later node reads either, so
// the receiver may change it in place (ZeRO-2 sums it over the ranks there). The others
// (non-gradients, and gradients still read later) are false: they wait for the end of the run.
std::vector<bool> early_update_outputs(const Graph& g);

}  // namespace fusetune
