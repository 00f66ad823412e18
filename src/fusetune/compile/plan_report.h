#pragma once
// The text `fusetune plan` prints for one compile mode: kernels per region, the fused groups,
// and the predicted peak memory breakdown.
#include <memory>
#include <string>

#include "fusetune/compile/memory_estimate.h"

namespace fusetune {

struct ModePlan {
  CompileMode mode = CompileMode::None;
  int64_t kernels[2] = {0, 0};      // per region: model, loss
  std::vector<std::string> fused;   // one line per fused node
  std::vector<std::string> passes;  // the pass report
  MemoryBreakdown memory;
  // Compiled modes: the arena the intermediates are placed in (part of memory.activations),
  // which stays allocated after the step; 0 in eager mode.
  int64_t arena_bytes = 0;
  // The graph as it runs (after the passes) and, in compiled modes, its memory plan (null in
  // eager mode): for estimates under other assumptions (recipes/rank_plan.h).
  std::shared_ptr<const Graph> graph;
  std::shared_ptr<const MemoryPlan> memory_plan;
};

// optimizer_in_bwd: gradients freed as soon as their parameter is updated (memory_estimate.h).
ModePlan plan_mode(const Graph& g, const PassOptions& opts,
                   const OptimizerStateSize& optimizer_state, bool optimizer_in_bwd = false);
std::string format_mode_plan(const ModePlan& p);

}  // namespace fusetune
