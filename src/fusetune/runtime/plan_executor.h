#pragma once
// Runs a compiled graph: the schedule is the node order, intermediates live at planned
// offsets in one arena (reused every step, and shared with the run's other compiled graphs
// when one is given: runtime/shared_arena.h), graph outputs get their own allocations, and
// anything the plan left unplaced is allocated eagerly and freed at last use.
#include <memory>

#include "fusetune/runtime/executor.h"
#include "fusetune/runtime/memory_plan.h"
#include "fusetune/runtime/shared_arena.h"

namespace fusetune {

class PlanExecutor : public Executor {
 public:
  // arena: shared with other executors of the run; null: one of its own.
  PlanExecutor(Graph g, MemoryPlan plan, std::shared_ptr<SharedArena> arena = nullptr);
  std::vector<Tensor> run(const TensorMap& inputs, const ParamSource& params,
                          const OnOutput& on_output) override;
  using Executor::run;
  const Graph& graph() const override { return g_; }
  const MemoryPlan& plan() const { return plan_; }

 private:
  Graph g_;
  MemoryPlan plan_;
  std::vector<int> release_at_;  // see release_points()
  std::shared_ptr<SharedArena> arena_;
};

}  // namespace fusetune
