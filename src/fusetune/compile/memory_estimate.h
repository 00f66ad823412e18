#pragma once
// What a training step will hold at its peak, predicted from the graph alone (no tensor is
// allocated): parameters, gradients, optimizer state, activations (eager: live intermediates
// freed at last use; compiled: the arena plus anything left to the eager allocator) and kernel
// workspace. `fusetune plan` prints it; a run then measures the real peak, and the two agree.
#include <cstdint>
#include <functional>
#include <string>

#include "fusetune/compile/memory_plan.h"
#include "fusetune/compile/pass.h"
#include "fusetune/optim/state_size.h"

namespace fusetune {

struct MemoryBreakdown {
  int64_t parameters = 0;  // Param leaves + graph-owned constants (NF4 base weights, RoPE)
  int64_t gradients = 0;
  int64_t optimizer_state = 0;
  int64_t activations = 0;  // at the step's peak, gradients excluded
  int64_t workspace = 0;    // kernel scratch at the peak (cross-entropy chunk, NF4 tiles, bf16)
  int64_t gathered = 0;     // ZeRO-3: the pool the other ranks' parameters are gathered into
  int peak_node = -1;       // the node running at the peak (-1: before the first)
  int64_t total() const {
    return parameters + optimizer_state + gradients + activations + workspace + gathered;
  }
};

// `g` is the graph as it will run (after passes for compiled modes, with `plan` its memory
// plan; plan == nullptr for eager). `freed_early`: the parameters whose gradient, when it can be
// handed over early (early_update_outputs in memory_plan.h), is freed right after its node
// instead of being held to the end of the step: every one with optimizer_in_bwd
// (all_gradients()), those other ranks own with ZeRO-2's reduce during the backward
// (distributed/owned_gradients.h); `gradients` is then what is held at the peak.
// `gathered` (ZeRO-3, distributed/sharded_params.h): the Param leaves whose value is a copy
// gathered from another rank when the leaf runs, held to its last use (views followed) like an
// intermediate, in a buffer from distributed/gather_pool.h: the pool ends up holding, per byte
// size, the most such buffers live at once in the step, throughout. That is `gathered`, counted
// instead of `parameters` (optimizer state still counts every trainable parameter: the caller
// shards it).
using GradientFreed = std::function<bool(const std::string& param)>;
GradientFreed all_gradients();
using GatheredParam = std::function<bool(const std::string& name)>;
MemoryBreakdown estimate_step_memory(const Graph& g, const MemoryPlan* plan,
                                     const OptimizerStateSize& optimizer_state,
                                     const GradientFreed& freed_early = {},
                                     const GatheredParam& gathered = {});

}  // namespace fusetune
