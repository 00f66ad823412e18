#pragma once
// How a training step's gradients are accumulated over its micro-batches and summed over the
// ranks (docs/design.md §8), chosen once per run: one of
//   sum after the backward  (one process; ZeRO-0/1: an all-reduce after the last backward)
//   streamed                (overlap_grad_allreduce: the last backward's gradients summed in
//                            buckets while it runs)
//   owned                   (ZeRO-2/3: each gradient reduced into the rank that owns it)
// The loop calls the same methods in the same order whichever it is: begin_step, run_micro and
// add for each micro-batch, end_micro_batches, reduce (ranks only, after the loss all-reduce),
// norm, then the optimizer.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fusetune/data/batch.h"
#include "fusetune/distributed/communicator.h"
#include "fusetune/distributed/grad_allreduce.h"
#include "fusetune/optim/param_ref.h"
#include "fusetune/recipes/training_step.h"
#include "fusetune/runtime/executor.h"

namespace fusetune {

class GradSync {
 public:
  virtual ~GradSync() = default;
  // Before the step's micro-batches (after the loss units are summed). `at_step`: " of step N"
  // for the collectives' names.
  virtual void begin_step(TrainingStep& step, const std::vector<Batch>& micro,
                          const std::string& at_step) = 0;
  // Forward and backward of micro-batch k of n; gradients handed over during the run and held
  // come back in the outputs (by name) to be added as usual.
  virtual StepOutputs run_micro(TrainingStep& step, const Batch& b, double scale,
                                int64_t global_step, size_t k, size_t n) = 0;
  // A gradient micro-batch k returned: into the accumulation buffers (or reduced first).
  virtual void add(const std::string& name, Tensor grad, size_t k) = 0;
  // After the last micro-batch, before any other collective of the step.
  virtual void end_micro_batches() {}
  // More than one rank, after the loss all-reduce: the gradients summed over the ranks.
  virtual void reduce() {}
  // The global gradient norm, clipped to `clip` when given (clip_grad_norm).
  virtual double norm(const std::vector<ParamRef>& refs, std::optional<double> clip) = 0;
  // Of this step's `comm_s` in collectives, what the step waited for (streamed only; called
  // once per step).
  virtual std::optional<double> comm_wait_seconds(double /*comm_s*/) { return std::nullopt; }
};

// What every strategy shares: the ranks, the trainable parameters in name order (the same on
// every rank) and the accumulation buffers the optimizer reads.
struct GradSyncContext {
  dist::Communicator* comm = nullptr;  // null: one process
  int rank = 0;
  int world = 1;
  const std::vector<std::string>* trainable = nullptr;
  const std::vector<int64_t>* trainable_numels = nullptr;
  TensorMap* grads = nullptr;
  int64_t bucket_elements = dist::kBucketElements;  // bucket_cap_mb (distributed/grad_allreduce.h)
  std::function<void(const std::string&)> log;      // a line in the run's log
};

// Adds a micro-batch's gradient into `grads[name]` (`first`: it replaces what is there).
void accumulate_gradient(TensorMap& grads, const std::string& name, Tensor g, bool first);

// Rank 0's `mine` (trainable names), on every rank, in rank 0's order; `what` names the
// broadcasts.
std::vector<std::string> rank0_order(const GradSyncContext& c, const std::vector<std::string>& mine,
                                     const std::string& what);

// The strategies (one file each).
std::unique_ptr<GradSync> make_sum_after_backward(const GradSyncContext& c);
// Null when the step cannot hand its gradients over during the backward.
std::unique_ptr<GradSync> make_streamed(const GradSyncContext& c, TrainingStep& step);
std::unique_ptr<GradSync> make_owned(const GradSyncContext& c, TrainingStep& step);

// The strategy for `zero_stage` (0 without ranks) and overlap_grad_allreduce (never with
// optimizer_in_bwd); logs why an asked-for overlap does not happen, naming `recipe`.
std::unique_ptr<GradSync> choose_grad_sync(const GradSyncContext& c, TrainingStep& step,
                                           int64_t zero_stage, bool overlap, bool in_bwd,
                                           const std::string& recipe);

}  // namespace fusetune
