#pragma once
// `fusetune plan --nproc_per_node N`: what one data-parallel rank holds at its peak for each
// ZeRO stage, from the single-process plan of its step (step_plan.h; batch_size is per rank)
// and the way the distributed loop (train_loop.cpp, distributed/) moves and frees gradients. A step
// has three moments that can be its peak:
//   backward   parameters + this rank's optimizer state + the step graph's peak (activations,
//              the gradients computed so far, kernel workspace) + the gradient accumulation
//              buffers while a later micro-batch runs (ZeRO-2: the owned gradients only);
//   all-reduce (stages 0, 1) parameters + optimizer state + the compiled arena (it stays
//              allocated) + every gradient + the bucket space (distributed/grad_allreduce.h);
//   update     parameters + optimizer state + arena + the gradients the optimizer sees (every
//              one; ZeRO-2 the owned ones) + (stages 1, 2) the staging bucket of the parameter
//              broadcast (distributed/sharded_optimizer.h).
// Full DPO adds the reference model's frozen copy of the parameters on every rank (stages
// 0-2; stage 3 shards it); GRPO's and PPO's frozen models are in the step's plan already
// (grpo_plan.h, ppo_plan.h), and PPO's value model shares the optimizer and its partition.
// ZeRO-2 with a step that hands its gradients over during the backward (streams_gradients):
// each gradient is reduced as it is handed over and freed unless this rank owns it, so the
// step graph is replayed with those gradients freed after their node (compile/
// memory_estimate.h); with accumulation, a later micro-batch's owned gradients are added into
// their buffers at once, so its backward holds every accumulation buffer and no fresh gradient.
// Without streaming (DPO) each micro-batch's gradients are reduced after its backward: the
// backward's peak is stage 1's. ZeRO-3: zero3_rank_plan.h.
#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "fusetune/recipes/step_plan.h"

namespace fusetune {

struct RankPeak {
  int64_t bytes = 0;
  std::string moment;  // "backward", "all-reduce" or "update"; ZeRO-3 also "forward", "loss"
  int64_t optimizer_state = 0;
  int64_t gradients_held = 0;  // at the update
  int64_t comm_buffers = 0;    // the larger of the bucket space and the broadcast staging
  int64_t gathered = 0;        // ZeRO-3: the pool other ranks' parameters are gathered into
};

// Sets `r`'s bytes and moment to the largest of the step's candidate moments.
void take_largest_moment(RankPeak& r,
                         std::initializer_list<std::pair<int64_t, const char*>> moments);

// Rank `rank` of `ranks` at `zero_stage` (0-3), `p` being the step's plan in its compile mode.
RankPeak plan_rank_peak(const PlannedStep& s, const ModePlan& p, int ranks, int rank,
                        int zero_stage);

// The text `fusetune plan --nproc_per_node N` prints: per stage 0-3, rank 0's peak and the
// largest rank's, with the moment it happens. A stage in `refused` (stage -> why: the config
// check's error with that zero_stage) gets that line instead of a row.
std::string format_rank_plans(const PlannedStep& s, const ModePlan& p, int ranks,
                              const std::map<int, std::string>& refused = {});

}  // namespace fusetune
