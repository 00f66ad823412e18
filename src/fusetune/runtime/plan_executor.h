#pragma once
// Runs a compiled graph: the schedule is the node order, intermediates live at planned
// offsets in one arena allocated once (and reused every step), graph outputs get their own
// allocations, and anything the plan left unplaced is allocated eagerly and freed at last use.
#include "fusetune/compile/memory_plan.h"
#include "fusetune/runtime/executor.h"

namespace fusetune {

class PlanExecutor : public Executor {
 public:
  PlanExecutor(Graph g, MemoryPlan plan);
  std::vector<Tensor> run(const TensorMap& inputs, const TensorMap& params) override;
  const Graph& graph() const { return g_; }
  const MemoryPlan& plan() const { return plan_; }

 private:
  Graph g_;
  MemoryPlan plan_;
  std::vector<int> release_at_;  // see release_points()
  Tensor arena_;
};

}  // namespace fusetune
