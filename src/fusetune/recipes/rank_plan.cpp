#include "fusetune/recipes/rank_plan.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <vector>

#include "fusetune/compile/compiler.h"
#include "fusetune/distributed/grad_allreduce.h"
#include "fusetune/distributed/grad_stream.h"
#include "fusetune/distributed/sharded_optimizer.h"
#include "fusetune/models/parameters.h"
#include "fusetune/models/ppo_graph.h"
#include "fusetune/recipes/distributed_recipes.h"
#include "fusetune/recipes/ppo_recipe.h"
#include "fusetune/recipes/zero3_rank_plan.h"
#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune {

void take_largest_moment(RankPeak& r,
                         std::initializer_list<std::pair<int64_t, const char*>> moments) {
  for (const auto& [bytes, moment] : moments)
    if (bytes > r.bytes) {
      r.bytes = bytes;
      r.moment = moment;
    }
}

namespace {

// The parameters the loop's optimizer trains in name order, as the loop sorts them (the ZeRO
// partition): the step graph's trainable ones and, with PPO, the value model's, which sit
// beside the policy's as value_model.<name> under the same optimizer (ppo_recipe.h).
std::vector<ParamInfo> rank_plan_trainable(const PlannedStep& s) {
  std::vector<ParamInfo> trainable;
  for (const ParamInfo& i : graph_parameters(s.graph.graph))
    if (i.trainable) trainable.push_back(i);
  if (s.ppo)
    for (ParamInfo i :
         graph_parameters(build_token_values_graph(s.ppo->value, 1, 4, s.options.dtype))) {
      i.name = kPpoValuePrefix + i.name;
      trainable.push_back(std::move(i));
    }
  std::sort(trainable.begin(), trainable.end(),
            [](const ParamInfo& a, const ParamInfo& b) { return a.name < b.name; });
  return trainable;
}

// What ZeRO-2 saves with this recipe's step.
const char* zero2_note(const PlannedStep& s) {
  if (s.ppo)
    return "reduces each PPO update's gradients into their owners when the step hands them "
           "over, after its micro-batches: it holds all of them until then, so stage 2 lowers "
           "the peak only at the update. ";
  if (streams_gradients(s))
    return "reduces each gradient into its owner as the backward produces it, so a rank "
           "holds only its own share of the gradients, in the backward too. ";
  return "reduces each micro-batch's gradients into their owner after its backward (this "
         "recipe's step hands none over during it): every backward still produces all "
         "the gradients, so stage 2 lowers the peak only through the accumulation "
         "buffers (gradient_accumulation_steps > 1) and the update. ";
}

}  // namespace

RankPeak plan_rank_peak(const PlannedStep& s, const ModePlan& p, int ranks, int rank,
                        int zero_stage) {
  FT_CHECK(ranks >= 1 && rank >= 0 && rank < ranks, "plan: bad rank");
  FT_CHECK(zero_stage >= 0 && zero_stage <= 3, "plan: zero_stage must be 0-3");
  if (zero_stage == 3) return plan_zero3_rank_peaks(s, p.mode, ranks)[size_t(rank)];
  const std::vector<ParamInfo> trainable = rank_plan_trainable(s);
  const int64_t elem = int64_t(dtype_size(s.options.dtype));
  std::vector<int64_t> numels, nbytes;
  std::vector<DType> dtypes;
  for (const ParamInfo& i : trainable) {
    int64_t n = 1;
    for (int64_t d : i.shape) n *= d;
    numels.push_back(n);
    nbytes.push_back(n * elem);
    dtypes.push_back(s.options.dtype);
  }
  const std::vector<int> owner = dist::partition_by_elements(numels, ranks);
  const MemoryBreakdown& m = p.memory;
  int64_t optimizer = m.optimizer_state, owned_grads = 0;
  if (zero_stage >= 1) optimizer = 0;
  for (size_t i = 0; i < trainable.size(); ++i)
    if (owner[i] == rank) {
      owned_grads += nbytes[i];
      if (zero_stage >= 1) optimizer += s.optimizer_state.bytes(numels[i], nbytes[i]);
    }
  const int64_t grads = m.gradients;
  const bool accumulating = s.gradient_accumulation_steps > 1;
  const int64_t graph_peak = m.activations + m.gradients + m.workspace;
  // Full DPO: every rank also holds the frozen reference weights (ref_checkpointer).
  const bool reference_copy =
      s.preference && s.preference->needs_reference() && s.recipe.rfind("full_dpo_", 0) == 0;
  const int64_t base = m.parameters * (reference_copy ? 2 : 1) + optimizer;
  // Collectives only with more than one rank (one rank returns before any buffer).
  int64_t bucket = ranks > 1 && zero_stage < 2
                       ? 4 * dist::allreduce_buffer_elements(numels, dtypes, s.bucket_elements)
                       : 0;
  // overlap_grad_allreduce: up to two buckets while the last backward hands over its gradients
  // (distributed/grad_stream.h), allocated as its first bucket fills; planned as held with all the
  // gradients, as the all-reduce after the backward (the first step's) is.
  if (ranks > 1 && zero_stage < 2 && s.overlap_grad_allreduce)
    bucket = std::max(bucket, 4 * dist::stream_buffer_elements(numels, dtypes, s.bucket_elements));
  const int64_t staging = zero_stage >= 1 ? dist::broadcast_buffer_bytes(nbytes, ranks) : 0;
  const int64_t held_at_update = zero_stage == 2 ? owned_grads : grads;
  // PPO's step sums its micro-batches' gradients itself and hands them over at each update:
  // between micro-batches it holds every one, at every stage.
  const int64_t accumulated = s.ppo ? grads : held_at_update;
  int64_t backward = base + graph_peak + (accumulating ? accumulated : 0);
  if (zero_stage == 2 && ranks > 1 && streams_gradients(s)) {
    // Each gradient reduced as the backward hands it over: the first micro-batch's backward
    // holds the owned ones; a later one's adds each into its accumulation buffer at once.
    // (The step's graph as planned in its mode, replayed with those gradients freed.)
    FT_CHECK(p.graph, "plan: the mode's plan keeps no graph");
    std::set<std::string> mine;
    for (size_t i = 0; i < trainable.size(); ++i)
      if (owner[i] == rank) mine.insert(trainable[i].name);
    auto graph_peak_freeing = [&](const GradientFreed& freed) {
      const MemoryBreakdown b = estimate_step_memory(*p.graph, p.memory_plan.get(), {}, freed);
      return b.activations + b.gradients + b.workspace;
    };
    backward = base + graph_peak_freeing([&mine](const std::string& n) { return !mine.count(n); });
    if (accumulating)
      backward = std::max(backward, base + graph_peak_freeing(all_gradients()) + owned_grads);
  }
  RankPeak r;
  take_largest_moment(r, {{backward, "backward"},
                          {bucket > 0 ? base + p.arena_bytes + grads + bucket : 0, "all-reduce"},
                          {base + p.arena_bytes + held_at_update + staging, "update"}});
  r.optimizer_state = optimizer;
  r.gradients_held = held_at_update;
  r.comm_buffers = std::max(bucket, staging);
  return r;
}

std::string format_rank_plans(const PlannedStep& s, const ModePlan& p, int ranks,
                              const std::map<int, std::string>& refused) {
  std::string out;
  char line[512];
  // batch_size as the config says it: GRPO's and PPO's count prompts (the planned step's rows
  // are GRPO's completions, PPO's micro-batch).
  const int64_t batch = s.grpo ? s.grpo->prompts : s.ppo ? s.ppo->prompts : s.options.batch_size;
  std::snprintf(line, sizeof line,
                "per-rank peak with --nproc_per_node %d (compile: %s; batch_size %lld per rank, "
                "global batch %lld):\n",
                ranks, compile_mode_name(p.mode), (long long)batch, (long long)(batch * ranks));
  out += line;
  std::snprintf(line, sizeof line, "%-10s %14s %14s %14s %14s  %s\n", "zero_stage", "rank 0",
                "largest rank", "optim state", "comm buffers", "peak at (rank 0)");
  out += line;
  std::string refusals;
  for (int stage = 0; stage <= 3; ++stage) {
    if (auto it = refused.find(stage); it != refused.end()) {
      refusals += "zero_stage " + std::to_string(stage) + " is refused: " + it->second + "\n";
      continue;
    }
    std::vector<RankPeak> peaks;
    if (stage == 3) {
      peaks = plan_zero3_rank_peaks(s, p.mode, ranks);  // the stage-3 graph planned once
    } else {
      for (int r = 0; r < ranks; ++r) peaks.push_back(plan_rank_peak(s, p, ranks, r, stage));
    }
    const RankPeak& r0 = peaks[0];
    int64_t largest = 0;
    for (const RankPeak& r : peaks) largest = std::max(largest, r.bytes);
    std::string moment = r0.moment;
    if (stage == 3)
      moment += " (" + format_bytes(double(r0.gathered)) + " gathered; reshard_after_forward: " +
                (s.reshard_after_forward ? "true" : "false") + ")";
    std::snprintf(line, sizeof line, "%-10d %14s %14s %14s %14s  %s\n", stage,
                  format_bytes(double(r0.bytes)).c_str(), format_bytes(double(largest)).c_str(),
                  format_bytes(double(r0.optimizer_state)).c_str(),
                  format_bytes(double(r0.comm_buffers)).c_str(), moment.c_str());
    out += line;
  }
  out += std::string("(stage 1 shards the optimizer state; stage 2 ") + zero2_note(s) +
         "Comm buffers: the gradient bucket space "
         "and the ZeRO-1/2 parameter broadcast staging; Open MPI's own buffers are not counted." +
         (refused.count(3) ? std::string()
                           : " Stage 3 holds each rank's own parameters and gathers the others "
                             "around their uses: 'gathered' is the pool of buffers they are "
                             "received into: per byte size, the most live at once, kept for "
                             "reuse.") +
         ")\n";
  out += refusals;
  if (s.optimizer_in_bwd && ranks > 1)
    out += "optimizer_in_bwd: true is refused with more than one rank\n";
  return out;
}

}  // namespace fusetune
