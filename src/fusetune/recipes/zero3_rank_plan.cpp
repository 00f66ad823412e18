#include "fusetune/recipes/zero3_rank_plan.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>

#include "fusetune/compile/compiler.h"
#include "fusetune/distributed/sharded_optimizer.h"
#include "fusetune/models/training_graph.h"
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

// KD's frozen teacher at stage 3 (distillation_recipe.cpp): sharded by its own partition, each
// rank holding its share, the pool its forward gathers the others' shares into (held from
// then on), and its output (hidden states, or logits) held through the student's step.
struct TeacherShare {
  int64_t owned = 0, gathered = 0, forward = 0, handed = 0;
};
std::vector<TeacherShare> teacher_shares(const PlannedStep& s, CompileMode mode,
                                         const PassOptions& po, bool fused, int ranks) {
  std::vector<TeacherShare> shares(static_cast<size_t>(ranks));
  if (!s.teacher) return shares;
  const TrainingGraphOptions& o = s.options;
  // Every weight is partitioned (the head too, which a fused step's teacher graph stops
  // before: the step gathers it for the fused kernel and holds it through the student's step).
  const Graph whole = build_logits_graph(*s.teacher, o.batch_size, o.seq_len, o.dtype);
  const Graph built =
      fused ? build_hidden_graph(*s.teacher, o.batch_size, o.seq_len, o.dtype) : whole;
  const Graph g = run_passes(built, po, nullptr);
  MemoryPlan plan;
  if (mode != CompileMode::None)
    plan = plan_memory(g, mode == CompileMode::Model ? 1 : -1, po.in_place);
  const std::map<std::string, ParamShare> params = partition(whole, ranks);
  const ParamShare& head =
      params.at(s.teacher->tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  for (int rank = 0; rank < ranks; ++rank) {
    TeacherShare& t = shares[size_t(rank)];
    for (const auto& [name, p] : params)
      if (p.owner == rank) t.owned += p.nbytes;
    const MemoryBreakdown m = estimate_step_memory(
        g, mode != CompileMode::None ? &plan : nullptr, {}, nullptr,
        [&params, rank](const std::string& name) { return params.at(name).owner != rank; });
    t.gathered = m.gathered;
    t.forward = m.activations + m.workspace;
    t.handed = int64_t(g.type(g.outputs()[0].second).nbytes());
    if (fused && head.owner != rank) t.handed += head.nbytes;  // the gathered head
  }
  return shares;
}

const char* moment_of(const Graph& g, int node) {
  if (node < 0) return "forward";
  const Node& n = g.nodes()[size_t(node)];
  return n.backward ? "backward" : n.region == 1 ? "loss" : "forward";
}

}  // namespace

std::vector<RankPeak> plan_zero3_rank_peaks(const PlannedStep& s, CompileMode mode, int ranks) {
  FT_CHECK(ranks >= 1, "plan: bad rank count");
  // The graph as the run compiles it at stage 3 (an NF4 base's parts bound as Params).
  std::optional<TrainingGraph> bound;
  if (s.nf4_bound_graph) bound = s.nf4_bound_graph();
  // KD under compile: true runs the fused step graph (kd_step.h).
  const bool fused_kd = s.fused_kd_graph && mode == CompileMode::Full;
  const Graph& source = bound ? bound->graph : fused_kd ? s.fused_kd_graph->graph : s.graph.graph;
  PassOptions po = step_pass_options(s, mode);
  po.params_at_use = true;
  po.reshard_after_forward = s.reshard_after_forward;
  const Graph g = run_passes(source, po, nullptr);
  const bool compiled = mode != CompileMode::None;
  MemoryPlan plan;
  if (compiled) plan = plan_memory(g, mode == CompileMode::Model ? 1 : -1, po.in_place);
  const std::map<std::string, ParamShare> params = partition(source, ranks);
  std::map<std::string, int64_t> gradient_bytes;
  for (const auto& [name, v] : g.outputs())
    if (name.rfind("grad:", 0) == 0) gradient_bytes[name.substr(5)] += int64_t(g.type(v).nbytes());
  const bool accumulating = s.gradient_accumulation_steps > 1;
  // Full DPO: every rank also holds the frozen reference weights (ref_checkpointer), sharded
  // by the same partition (dpo_recipes.cpp), and the pool its reference pass gathers the
  // others' shares into.
  const bool reference_copy =
      s.preference && s.preference->needs_reference() && s.recipe.rfind("full_dpo_", 0) == 0;
  std::optional<Graph> reference_pass;
  MemoryPlan reference_plan;
  if (reference_copy) {
    reference_pass =
        run_passes(build_sequence_log_probs_graph(s.model, s.options.batch_size, s.options.seq_len,
                                                  s.options.dtype, LlamaOptions{}),
                   po, nullptr);
    if (compiled)
      reference_plan =
          plan_memory(*reference_pass, mode == CompileMode::Model ? 1 : -1, po.in_place);
  }

  const std::vector<TeacherShare> teacher = teacher_shares(s, mode, po, fused_kd, ranks);

  std::vector<RankPeak> peaks;
  for (int rank = 0; rank < ranks; ++rank) {
    const TeacherShare& t = teacher[size_t(rank)];
    int64_t optimizer = 0, owned_grads = 0;
    for (const auto& [name, p] : params) {
      if (p.owner != rank || !p.trainable) continue;
      optimizer += s.optimizer_state.bytes(p.numel, p.nbytes);
      if (auto it = gradient_bytes.find(name); it != gradient_bytes.end())
        owned_grads += it->second;
    }
    const auto others = [&params, rank](const std::string& name) {
      return params.at(name).owner != rank;
    };
    // A step that streams its gradients reduces each one as the backward hands it over
    // (distributed/owned_gradients.h): the first micro-batch holds the owned ones, a later one adds
    // each into its accumulation buffer at once.
    const bool streams = ranks > 1 && streams_gradients(s);
    const MemoryBreakdown m = estimate_step_memory(
        g, compiled ? &plan : nullptr, {}, streams ? GradientFreed(others) : nullptr, others);
    // m.parameters: the owned parameters and the graph's constants.
    const int64_t reference =
        reference_copy ? m.parameters + estimate_step_memory(*reference_pass,
                                                             compiled ? &reference_plan : nullptr,
                                                             {}, nullptr, others)
                                            .gathered
                       : 0;
    const int64_t base = m.parameters + reference + optimizer + t.owned + t.gathered;
    auto step_peak = [&](const MemoryBreakdown& b, int64_t accumulated) {
      return base + t.handed + b.activations + b.gradients + b.workspace + b.gathered + accumulated;
    };
    RankPeak r;
    take_largest_moment(
        r, {{step_peak(m, accumulating && !streams ? owned_grads : 0), moment_of(g, m.peak_node)},
            {base + (compiled ? plan.arena_bytes : 0) + owned_grads + m.gathered, "update"}});
    if (s.teacher && base + t.forward > r.bytes) {
      r.bytes = base + t.forward;
      r.moment = "teacher forward";
    }
    if (streams && accumulating) {
      const MemoryBreakdown later =
          estimate_step_memory(g, compiled ? &plan : nullptr, {}, all_gradients(), others);
      if (step_peak(later, owned_grads) > r.bytes) {
        r.bytes = step_peak(later, owned_grads);
        r.moment = moment_of(g, later.peak_node);
      }
    }
    r.optimizer_state = optimizer;
    r.gradients_held = owned_grads;
    r.gathered = m.gathered;
    peaks.push_back(std::move(r));
  }
  return peaks;
}

}  // namespace fusetune
