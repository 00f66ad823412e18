#pragma once
// The training step as a unit (docs/design.md §7). The loop (train_loop.h) is the same for every
// recipe: micro-batches -> step -> accumulate gradients -> clip -> optimizer -> log the named
// metrics -> checkpoint. A recipe supplies its step: what one micro-batch computes, by name.
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fusetune/compile/compiler.h"
#include "fusetune/data/batch.h"
#include "fusetune/graph/graph.h"
#include "fusetune/runtime/executor.h"

namespace fusetune {

// Receives each parameter's gradient as soon as the backward has computed it (the step keeps no
// reference to it afterwards, so dropping it frees its buffer, and nothing in the step reads it
// again, so the receiver may change it in place): optimizer_in_bwd, overlap_grad_allreduce,
// ZeRO-2's reduce during the backward.
using GradientHook = std::function<void(const std::string& param, Tensor grad)>;

// A logged metric as a sum and what it divides by (pairs, tokens): the loop sums both over the
// step's micro-batches and ranks and logs sum / count, the value over all the step's samples.
struct StepMetric {
  StepMetric() = default;
  StepMetric(std::string n, double s, double c) : name(std::move(n)), sum(s), count(c) {}
  std::string name;
  double sum = 0;
  double count = 0;
  // When set, the logged value is instead the first named metric's value minus the second's
  // (0 when either has no count): a difference of two means over the whole step, which no
  // sum / count can carry (unpaired KTO's rewards/margins).
  std::pair<std::string, std::string> difference_of;
};

struct StepOutputs {
  double loss = 0;  // this micro-batch's share of the optimizer step's loss
  std::vector<std::pair<std::string, Tensor>> grads;  // by parameter name
  std::vector<StepMetric> metrics;                    // the same names every micro-batch
};

class TrainingStep {
 public:
  virtual ~TrainingStep() = default;
  // What the loss is averaged over, in one micro-batch (SFT: unmasked labels; DPO: pairs). The
  // loop sums it over the optimizer step's micro-batches and passes 1 / sum as loss_scale.
  virtual int64_t loss_units(const Batch& b) const = 0;
  // Called with the optimizer step's micro-batches before loss_units and run see any of them
  // (GRPO generates its rollouts here: dapo normalizes by the whole step's completion tokens).
  virtual void begin_step(const std::vector<Batch>& /*micro*/, int64_t /*global_step*/) {}
  // The positions micro-batch `b` trains on, which the step line's tokens_per_second_per_gpu
  // counts: its unmasked labels (GRPO: its rollout's completion tokens, as its prompt batches
  // carry no labels).
  virtual int64_t trained_tokens(const Batch& b) const { return b.num_valid_labels(); }
  // Forward + backward of one micro-batch.
  virtual StepOutputs run(const Batch& b, double loss_scale, int64_t global_step,
                          int64_t micro_step) = 0;
  // Model FLOPs the step spends on `b` (the numerator of mfu).
  virtual double flops(const Batch& b) const = 0;
  // Validation (dataset_val): the loss of `b` summed over its loss units, with the weights as
  // they are (no gradients, no dropout). Steps without validation throw.
  virtual double evaluate(const Batch& b);
  // optimizer_in_bwd: from now on every gradient goes to `hook` during run() (in backward
  // order; a parameter the graph still reads after its gradient is ready gets it when the
  // graph has finished) instead of into StepOutputs::grads. False: this step cannot.
  virtual bool stream_gradients(GradientHook /*hook*/) { return false; }
  // The parameter names in the order the hook receives b's gradients (compiling b's graph if
  // needed); empty for a step that cannot stream them.
  virtual std::vector<std::string> gradient_order(const Batch& /*b*/) { return {}; }
  // True: run() applies its own updates (several per loop step, through StepContext::
  // apply_update or the optimizer_in_bwd hook) and returns no gradients; the loop then only
  // checks the returned loss. PPO's ppo_epochs x mini-batches.
  virtual bool updates_itself() const { return false; }
  // Seconds spent building and compiling step graphs since the last call.
  double take_compile_seconds() { return std::exchange(compile_s_, 0.0); }

 protected:
  double compile_s_ = 0;
};

// Step graphs compiled once per batch shape (rows, seq_len, packed): unpacked batches are
// padded to buckets, so there are few. They place their intermediates in one shared arena,
// as large as the largest plan (runtime/shared_arena.h); pass the same arena to several
// caches whose graphs run one after the other (a DPO step's policy and reference).
class CompiledGraphs {
 public:
  using Build = std::function<Graph(int64_t rows, int64_t seq_len, bool packed)>;
  CompiledGraphs(Build build, PassOptions passes,
                 std::shared_ptr<SharedArena> arena = std::make_shared<SharedArena>())
      : build_(std::move(build)), passes_(std::move(passes)), arena_(std::move(arena)) {}
  // Runs the graph for b's shape (built and compiled on first use, the time added to
  // *compile_s) and returns its outputs by name. With `gradients`, the "grad:<param>" outputs
  // go to it instead, each as soon as it is computed when no later node reads its parameter
  // (early_update_outputs in compile/memory_plan.h), the others when the graph has finished.
  TensorMap run(const Batch& b, const TensorMap& inputs, const ParamSource& params,
                double* compile_s, const GradientHook& gradients = {});
  // The parameters in the order run() hands b's gradients to `gradients`: the early ones in
  // the order the backward computes them, then the others in output order.
  std::vector<std::string> gradient_order(const Batch& b, double* compile_s);

 private:
  struct Entry {
    std::vector<std::string> output_names;
    std::vector<bool> early;  // early_update_outputs of the graph as it runs
    CompiledStep step;
  };
  const Entry& entry(const Batch& b, double* compile_s);
  Build build_;
  PassOptions passes_;
  std::shared_ptr<SharedArena> arena_;
  std::map<std::tuple<int64_t, int64_t, bool>, Entry> entries_;
};

// The inputs every step graph reads: "tokens", "labels", "positions" (and "doc_ids" when
// packed), [rows, T] I32.
TensorMap batch_inputs(const Batch& b);
Tensor scalar_input(double value, DType dtype);
// The "grad:<param>" outputs of a step graph, by parameter name.
std::vector<std::pair<std::string, Tensor>> gradients_of(const TensorMap& outputs);

}  // namespace fusetune
