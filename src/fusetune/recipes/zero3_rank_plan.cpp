#include "fusetune/recipes/zero3_rank_plan.h"

#include <algorithm>
#include <map>
#include <string>

#include "fusetune/compile/compiler.h"
#include "fusetune/dist/sharded_optimizer.h"
#include "fusetune/recipes/distributed_recipes.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

struct ParamShare {
  int64_t numel = 0;
  int64_t nbytes = 0;  // as stored (the Param leaf's type)
  bool trainable = false;
  int owner = 0;
};

// dist::ShardedParams' partition: trainable and frozen parameters separately, each in name order.
std::map<std::string, ParamShare> partition(const Graph& g, int ranks) {
  std::map<std::string, ParamShare> params;
  for (const Node& n : g.nodes())
    if (n.op == Op::Param)
      params[n.name] = {n.outputs[0].numel(), int64_t(n.outputs[0].nbytes()), n.trainable, 0};
  for (const bool trainable : {true, false}) {
    std::vector<ParamShare*> group;  // name order (the map's)
    std::vector<int64_t> numels;
    for (auto& [name, p] : params)
      if (p.trainable == trainable) {
        group.push_back(&p);
        numels.push_back(p.numel);
      }
    const std::vector<int> owner = dist::partition_by_elements(numels, ranks);
    for (size_t i = 0; i < group.size(); ++i) group[i]->owner = owner[i];
  }
  return params;
}

const char* moment_of(const Graph& g, int node) {
  if (node < 0) return "forward";
  const Node& n = g.nodes()[size_t(node)];
  return n.backward ? "backward" : n.region == 1 ? "loss" : "forward";
}

}  // namespace

std::vector<RankPeak> plan_zero3_rank_peaks(const PlannedStep& s, CompileMode mode, int ranks) {
  FT_CHECK(ranks >= 1, "plan: bad rank count");
  FT_CHECK(!s.nf4, std::string("plan: zero_stage 3 is ") + kZero3NF4NotPredicted);
  // The graph as the run compiles it at stage 3.
  PassOptions po;
  po.mode = mode;
  po.activation_checkpointing = s.activation_checkpointing;
  po.params_at_use = true;
  po.reshard_after_forward = s.reshard_after_forward;
  const Graph g = run_passes(s.graph.graph, po, nullptr);
  const bool compiled = mode != CompileMode::None;
  MemoryPlan plan;
  if (compiled) plan = plan_memory(g, mode == CompileMode::Model ? 1 : -1, po.in_place);
  const std::map<std::string, ParamShare> params = partition(s.graph.graph, ranks);
  int64_t all_param_bytes = 0;
  for (const auto& [name, p] : params) all_param_bytes += p.nbytes;
  std::map<std::string, int64_t> gradient_bytes;
  for (const auto& [name, v] : g.outputs())
    if (name.rfind("grad:", 0) == 0) gradient_bytes[name.substr(5)] += int64_t(g.type(v).nbytes());
  const bool accumulating = s.gradient_accumulation_steps > 1;
  // Full DPO: every rank also holds the frozen reference weights (ref_checkpointer), whole.
  const bool reference_copy =
      s.preference && s.preference->needs_reference() && s.recipe.rfind("full_dpo_", 0) == 0;

  std::vector<RankPeak> peaks;
  for (int rank = 0; rank < ranks; ++rank) {
    int64_t optimizer = 0, owned_grads = 0, owned_params = 0;
    for (const auto& [name, p] : params) {
      if (p.owner != rank) continue;
      owned_params += p.nbytes;
      if (!p.trainable) continue;
      optimizer += s.optimizer_state.bytes(p.numel, p.nbytes);
      if (auto it = gradient_bytes.find(name); it != gradient_bytes.end())
        owned_grads += it->second;
    }
    const MemoryBreakdown m = estimate_step_memory(
        g, compiled ? &plan : nullptr, OptimizerStateSize{}, false,
        [&params, rank](const std::string& name) { return params.at(name).owner != rank; });
    // m.parameters: the owned parameters and the graph's constants.
    const int64_t reference = reference_copy ? m.parameters - owned_params + all_param_bytes : 0;
    const int64_t base = m.parameters + reference + optimizer;
    RankPeak r;
    take_largest_moment(
        r, {{base + m.activations + m.gradients + m.workspace + m.gathered +
                 (accumulating ? owned_grads : 0),
             moment_of(g, m.peak_node)},
            {base + (compiled ? plan.arena_bytes : 0) + owned_grads + m.gathered, "update"}});
    r.optimizer_state = optimizer;
    r.gradients_held = owned_grads;
    r.gathered = m.gathered;
    peaks.push_back(std::move(r));
  }
  return peaks;
}

}  // namespace fusetune
