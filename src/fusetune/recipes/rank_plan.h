#pragma once
// `fusetune plan --nproc_per_node N`: what one data-parallel rank holds at its peak for each
// ZeRO stage, from the single-process plan of its step (step_plan.h; batch_size is per rank)
// and the way the distributed loop (train_loop.cpp, dist/) moves and frees gradients. A step
// has three moments that can be its peak:
//   backward   parameters + this rank's optimizer state + the step graph's peak (activations,
//              the gradients computed so far, kernel workspace) + the gradient accumulation
//              buffers while a later micro-batch runs (ZeRO-2: the owned gradients only);
//   all-reduce (stages 0, 1) parameters + optimizer state + the compiled arena (it stays
//              allocated) + every gradient + the bucket space (dist/grad_allreduce.h);
//   update     parameters + optimizer state + arena + the gradients the optimizer sees (every
//              one; ZeRO-2 the owned ones) + (stages 1, 2) the staging bucket of the parameter
//              broadcast (dist/sharded_optimizer.h).
// Full DPO adds the reference model's frozen copy of the parameters on every rank.
// ZeRO-2 reduces each micro-batch's gradients after its backward, not during it: every rank's
// backward still produces every gradient, so with one micro-batch its peak is stage 1's
// backward; it saves the accumulation buffers of the gradients other ranks own and, at the
// update, those gradients themselves. ZeRO-3: zero3_rank_plan.h.
#include <cstdint>
#include <initializer_list>
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
// largest rank's, with the moment it happens (stage 3 with an NF4 base: not predicted yet).
std::string format_rank_plans(const PlannedStep& s, const ModePlan& p, int ranks);

}  // namespace fusetune
