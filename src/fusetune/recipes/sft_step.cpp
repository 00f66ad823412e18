#include "fusetune/recipes/sft_step.h"

#include "fusetune/models/flops.h"
#include "fusetune/models/training_graph.h"

namespace fusetune {
namespace {

class SftStep final : public TrainingStep {
 public:
  explicit SftStep(ModelStepOptions o)
      : o_(std::move(o)),
        graphs_(
            [this](int64_t rows, int64_t T, bool packed) {
              TrainingGraphOptions g;
              g.batch_size = rows;
              g.seq_len = T;
              g.packed = packed;
              g.trainable = o_.trainable;
              g.llama = o_.llama;
              return build_training_graph(*o_.model, g).graph;
            },
            o_.passes) {}

  int64_t loss_units(const Batch& b) const override { return b.num_valid_labels(); }

  StepOutputs run(const Batch& b, double loss_scale, int64_t step, int64_t micro) override {
    TensorMap in = batch_inputs(b);
    in["loss_scale"] = scalar_input(loss_scale, DType::F32);
    if (o_.add_inputs) o_.add_inputs(in, step, micro);
    TensorMap out = graphs_.run(b, in, *o_.params, &compile_s_);
    StepOutputs r;
    r.loss = element_as_double(out.at("loss"), 0);
    r.grads = gradients_of(out);
    return r;
  }

  double flops(const Batch& b) const override {
    return training_flops_per_token(*o_.model, b.seq_len, o_.trainable) *
           double(b.batch_size * b.seq_len);
  }

 private:
  ModelStepOptions o_;
  CompiledGraphs graphs_;
};

}  // namespace

std::unique_ptr<TrainingStep> make_sft_step(ModelStepOptions opts) {
  return std::make_unique<SftStep>(std::move(opts));
}

}  // namespace fusetune
