#pragma once
// Memory planning (DESIGN.md §3): liveness over the scheduled nodes, then every intermediate
// buffer gets an offset in one arena, placed greedily by size so buffers whose lifetimes
// overlap never share bytes. Leaves, graph outputs and views are not placed: leaves are bound
// by the caller, outputs outlive the step, views alias their source (whose lifetime they
// extend). With `dynamic_region` >= 0, nodes of that region are left to the eager allocator,
// as an uncompiled loss runs in PyTorch.
#include <cstdint>
#include <vector>

#include "fusetune/graph/graph.h"

namespace fusetune {

struct MemoryPlan {
  // offsets[node][output]: byte offset in the arena, or -1 when not placed.
  std::vector<std::vector<int64_t>> offsets;
  int64_t arena_bytes = 0;
  int64_t placed_bytes = 0;  // sum of placed buffer sizes (what eager would allocate overall)
  int64_t buffers = 0;
};

MemoryPlan plan_memory(const Graph& g, int dynamic_region = -1);

// Per node, the index of the last node that reads it or any view of it (INT_MAX for graph
// outputs and the views/sources of graph outputs).
std::vector<int> last_uses(const Graph& g);

}  // namespace fusetune
