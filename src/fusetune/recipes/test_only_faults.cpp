#include "fusetune/recipes/test_only_faults.h"

#include <cstdlib>
#include <limits>
#include <string>

#include "fusetune/util/error.h"

namespace fusetune::test_only {
namespace {

void make_first_element_inf(Tensor& g) {
  FT_CHECK(g.defined() && g.numel() > 0,
           std::string(kInfGradientAtStepEnv) + ": the gradient to poison is empty");
  g.drop_nonzero_rows();  // element 0 may lie outside an embedding gradient's rows
  switch (g.dtype()) {
    case DType::F32:
      g.data<float>()[0] = std::numeric_limits<float>::infinity();
      break;
    case DType::F64:
      g.data<double>()[0] = std::numeric_limits<double>::infinity();
      break;
    case DType::BF16:
      g.data<uint16_t>()[0] = 0x7f80;  // +inf
      break;
    default:
      throw Error(std::string(kInfGradientAtStepEnv) + ": a gradient of dtype " +
                  dtype_name(g.dtype()));
  }
}

class InfGradientStep : public TrainingStep {
 public:
  InfGradientStep(std::unique_ptr<TrainingStep> inner, int64_t at)
      : inner_(std::move(inner)), at_(at) {}

  int64_t loss_units(const Batch& b) const override { return inner_->loss_units(b); }
  void begin_step(const std::vector<Batch>& micro, int64_t global_step) override {
    inner_->begin_step(micro, global_step);
    compile_s_ += inner_->take_compile_seconds();
  }
  StepOutputs run(const Batch& b, double loss_scale, int64_t global_step,
                  int64_t micro_step) override {
    pending_ = global_step + 1 == at_ && micro_step == 0;
    StepOutputs out = inner_->run(b, loss_scale, global_step, micro_step);
    compile_s_ += inner_->take_compile_seconds();
    if (pending_ && !out.grads.empty()) {
      make_first_element_inf(out.grads.front().second);
      pending_ = false;
    }
    FT_CHECK(!pending_, std::string(kInfGradientAtStepEnv) + ": step " + std::to_string(at_) +
                            " handed over no gradient to poison");
    return out;
  }
  double flops(const Batch& b) const override { return inner_->flops(b); }
  double evaluate(const Batch& b) override {
    const double loss = inner_->evaluate(b);
    compile_s_ += inner_->take_compile_seconds();
    return loss;
  }
  bool stream_gradients(GradientHook hook) override {
    return inner_->stream_gradients([this, hook](const std::string& name, Tensor g) {
      if (pending_) {
        make_first_element_inf(g);
        pending_ = false;
      }
      hook(name, std::move(g));
    });
  }
  std::vector<std::string> gradient_order(const Batch& b) override {
    std::vector<std::string> order = inner_->gradient_order(b);
    compile_s_ += inner_->take_compile_seconds();
    return order;
  }

 private:
  std::unique_ptr<TrainingStep> inner_;
  int64_t at_;
  bool pending_ = false;
};

}  // namespace

std::optional<int64_t> inf_gradient_step() {
  const char* env = std::getenv(kInfGradientAtStepEnv);
  if (env == nullptr || *env == '\0') return std::nullopt;
  char* end = nullptr;
  const long long v = std::strtoll(env, &end, 10);
  FT_CHECK(end != env && *end == '\0' && v >= 1,
           std::string(kInfGradientAtStepEnv) + " must be a step number >= 1, got '" + env + "'");
  return int64_t(v);
}

std::unique_ptr<TrainingStep> with_inf_gradient(std::unique_ptr<TrainingStep> step, int64_t at,
                                                bool this_rank) {
  if (!this_rank) return step;
  return std::make_unique<InfGradientStep>(std::move(step), at);
}

}  // namespace fusetune::test_only
