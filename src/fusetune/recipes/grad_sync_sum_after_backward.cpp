// One process, or ZeRO-0/1 over ranks: each micro-batch's gradients accumulate where they are;
// with ranks, the accumulated gradients are all-reduced after the last backward (docs/design.md
// §7: accumulate -> reduce -> clip).
#include "fusetune/distributed/grad_allreduce.h"
#include "fusetune/optim/grad_clip.h"
#include "fusetune/recipes/grad_sync.h"

namespace fusetune {
namespace {

class SumAfterBackward final : public GradSync {
 public:
  explicit SumAfterBackward(GradSyncContext c) : c_(std::move(c)) {}

  void begin_step(TrainingStep&, const std::vector<Batch>&, const std::string& at_step) override {
    at_step_ = at_step;
  }
  StepOutputs run_micro(TrainingStep& step, const Batch& b, double scale, int64_t global_step,
                        size_t k, size_t) override {
    return step.run(b, scale, global_step, int64_t(k));
  }
  void add(const std::string& name, Tensor grad, size_t k) override {
    accumulate_gradient(*c_.grads, name, std::move(grad), k == 0);
  }
  void reduce() override {
    std::vector<Tensor*> summed;
    for (const std::string& name : *c_.trainable)  // sorted: the same order on every rank
      if (auto it = c_.grads->find(name); it != c_.grads->end()) summed.push_back(&it->second);
    dist::allreduce_gradients(*c_.comm, summed, "the gradient all-reduce" + at_step_,
                              c_.bucket_elements);
  }
  double norm(const std::vector<ParamRef>& refs, std::optional<double> clip) override {
    return clip ? clip_grad_norm(refs, *clip) : fusetune::grad_norm(refs);
  }

 private:
  GradSyncContext c_;
  std::string at_step_;
};

}  // namespace

std::unique_ptr<GradSync> make_sum_after_backward(const GradSyncContext& c) {
  return std::make_unique<SumAfterBackward>(c);
}

}  // namespace fusetune
