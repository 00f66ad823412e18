#include "fusetune/runtime/plan_executor.h"

#include "fusetune/runtime/run_nodes.h"

namespace fusetune {

PlanExecutor::PlanExecutor(Graph g, MemoryPlan plan, std::shared_ptr<SharedArena> arena)
    : g_(std::move(g)),
      plan_(std::move(plan)),
      release_at_(release_points(g_)),
      arena_(arena ? std::move(arena) : std::make_shared<SharedArena>()) {
  arena_->reserve(plan_.arena_bytes);
}

std::vector<Tensor> PlanExecutor::run(const TensorMap& inputs, const ParamSource& params,
                                      const OnOutput& on_output) {
  char* base = arena_->reserve(plan_.arena_bytes);
  return run_nodes(
      g_, release_at_, inputs, params,
      [&](size_t node, size_t k, const TensorType& t) {
        const int64_t off = plan_.offsets[node][k];
        return off >= 0 ? Tensor::borrow(base + off, t.shape, t.dtype, nullptr)
                        : fresh_output(g_.nodes()[node], t);
      },
      on_output, NodeScratch{base + plan_.scratch_offset, plan_.scratch_bytes});
}

}  // namespace fusetune
