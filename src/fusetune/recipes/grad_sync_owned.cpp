// ZeRO-2, 3: each gradient is summed into the rank that owns its parameter and dropped by the
// others (distributed/owned_gradients.h). A step that hands its gradients over during the
// backward has each one reduced right then, so no rank holds the gradients other ranks own, in
// the backward either; the others (DPO) reduce each micro-batch's gradients after its backward,
// in name order.
#include "fusetune/distributed/owned_gradients.h"
#include "fusetune/optim/grad_clip.h"
#include "fusetune/recipes/grad_sync.h"

namespace fusetune {
namespace {

class Owned final : public GradSync {
 public:
  Owned(GradSyncContext c, TrainingStep& step)
      : c_(std::move(c)), owned_(*c_.comm, *c_.trainable, *c_.trainable_numels) {
    if (c_.world > 1)
      streams_ = step.stream_gradients([this](const std::string& name, Tensor g) {
        g.drop_nonzero_rows();  // ZeRO-2/3 reduce gradients densely (docs/design.md §8)
        owned_.hand_over(
            name, std::move(g),
            [this](const std::string& owned, Tensor sum) {
              accumulate_gradient(*c_.grads, owned, std::move(sum), micro_k_ == 0);
            },
            reduce_what_);
      });
  }

  void begin_step(TrainingStep& step, const std::vector<Batch>& micro,
                  const std::string& at_step) override {
    at_step_ = at_step;
    reduce_what_ = "the gradient reduce (ZeRO-2)" + at_step;
    if (streams_ && !owned_.has_order())
      owned_.set_order(
          rank0_order(c_, c_.rank == 0 ? step.gradient_order(micro[0]) : std::vector<std::string>{},
                      "the gradient order broadcast (ZeRO-2)"));
  }
  StepOutputs run_micro(TrainingStep& step, const Batch& b, double scale, int64_t global_step,
                        size_t k, size_t) override {
    micro_k_ = int64_t(k);
    StepOutputs out = step.run(b, scale, global_step, int64_t(k));
    if (streams_) owned_.end_of_backward();
    return out;
  }
  void add(const std::string& name, Tensor grad, size_t k) override {
    if (c_.world > 1) grad.drop_nonzero_rows();  // reduced densely, as above
    if (!owned_.reduce(name, grad, "the gradient reduce (ZeRO-2)" + at_step_)) return;
    accumulate_gradient(*c_.grads, name, std::move(grad), k == 0);
  }
  double norm(const std::vector<ParamRef>& refs, std::optional<double> clip) override {
    // Each rank holds its share of the gradients.
    const double total = owned_.global_norm(refs, "the gradient norm all-reduce" + at_step_);
    if (clip) clip_to_norm(refs, *clip, total);
    return total;
  }

 private:
  GradSyncContext c_;
  dist::OwnedGradients owned_;
  bool streams_ = false;
  int64_t micro_k_ = 0;
  std::string at_step_;
  std::string reduce_what_;  // the step, for a timeout message
};

}  // namespace

std::unique_ptr<GradSync> make_owned(const GradSyncContext& c, TrainingStep& step) {
  return std::make_unique<Owned>(c, step);
}

}  // namespace fusetune
