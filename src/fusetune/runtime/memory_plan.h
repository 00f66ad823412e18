#pragma once
// What the plan executor runs (plan_executor.h): where every intermediate buffer of a compiled
// graph lives in one arena, and which nodes write over an input. The executor owns it; the
// compile pass that computes it is compile/memory_plan.h (plan_memory, docs/design.md §5).
#include <cstdint>
#include <vector>

namespace fusetune {

struct MemoryPlan {
  // offsets[node][output]: byte offset in the arena, or -1 when not placed.
  std::vector<std::vector<int64_t>> offsets;
  int64_t arena_bytes = 0;                        // the placed buffers, then the scratch slice
  int64_t scratch_offset = 0, scratch_bytes = 0;  // a node needing more allocates its own
  int64_t placed_bytes = 0;  // sum of placed buffer sizes (what eager would allocate overall)
  int64_t buffers = 0;
  // writes_over[node]: the node whose buffer this node's output 0 reuses in place, or -1.
  std::vector<int> writes_over;
  int64_t in_place = 0;  // number of nodes writing over an input
};

}  // namespace fusetune
