#pragma once
// `fusetune plan --nproc_per_node N` at ZeRO-3 (distributed/sharded_params.h): what each rank holds
// at its peak. The step graph is planned as the run compiles it, with params_at_use
// (compile/params_at_use.h; fsdp_reshard_after_forward as configured), and its allocations are
// replayed (compile/memory_estimate.h) with each parameter another rank owns gathered at its
// leaf and freed after its last use into a pool of reused buffers (distributed/gather_pool.h: per
// byte size, the most live at once, held from then on), so the gathered bytes are exact. Rank r
// holds throughout its own parameters (whole tensors by their stored bytes: trainable and
// frozen ones each partitioned by element count in name order), the graph's constants and the
// optimizer state of its trainable parameters; then
//   forward/backward/loss  + the step graph's peak (activations, the gradients computed so far,
//              kernel workspace) + the gather pool + the owned gradients' accumulation buffers
//              while a later micro-batch runs (with a step that streams its gradients, each is
//              reduced as the backward hands it over and only the owned ones are kept: as
//              rank_plan.h's ZeRO-2);
//   update     + the compiled arena + the gather pool + the owned gradients (owners update in
//              place: nothing is broadcast, and the gradient reduce needs no bucket).
// Full DPO adds its frozen reference model, sharded by the same partition: each rank its own
// share and the pool its reference pass gathers the others into. KD adds its frozen teacher,
// sharded by a partition of its own: each rank its share, the pool its forward gathers the
// others' into, and the forward's output held through the student's step.
#include <vector>

#include "fusetune/recipes/rank_plan.h"

namespace fusetune {

// Every rank's peak, rank 0 first.
std::vector<RankPeak> plan_zero3_rank_peaks(const PlannedStep& s, CompileMode mode, int ranks);

}  // namespace fusetune
