#include "fusetune/recipes/sft_step.h"

#include "fusetune/models/flops.h"
#include "fusetune/models/training_graph.h"

namespace fusetune {
namespace {

class SftStep final : public TrainingStep {
 public:
  explicit SftStep(ModelStepOptions o)
      : o_(std::move(o)),
        graphs_([this](int64_t rows, int64_t T,
                       bool packed) { return graph(rows, T, packed, o_.trainable, o_.llama); },
                o_.passes, arena_),
        eval_(
            [this](int64_t rows, int64_t T, bool packed) {
              // Forward and loss only: nothing trains, so autodiff adds no backward.
              return graph(
                  rows, T, packed, [](const std::string&) { return false; },
                  o_.eval_llama ? *o_.eval_llama : o_.llama);
            },
            o_.passes, arena_) {}

  int64_t loss_units(const Batch& b) const override { return b.num_valid_labels(); }

  StepOutputs run(const Batch& b, double loss_scale, int64_t step, int64_t micro) override {
    TensorMap in = batch_inputs(b);
    in["loss_scale"] = scalar_input(loss_scale, DType::F32);
    if (o_.add_inputs) o_.add_inputs(in, step, micro);
    TensorMap out = graphs_.run(b, in, params(), &compile_s_, hook_);
    StepOutputs r;
    r.loss = element_as_double(out.at("loss"), 0);
    r.grads = gradients_of(out);
    return r;
  }

  bool stream_gradients(GradientHook hook) override {
    hook_ = std::move(hook);
    return true;
  }

  std::vector<std::string> gradient_order(const Batch& b) override {
    return graphs_.gradient_order(b, &compile_s_);
  }

  double evaluate(const Batch& b) override {
    TensorMap in = batch_inputs(b);
    in["loss_scale"] = scalar_input(1.0, DType::F32);
    return element_as_double(eval_.run(b, in, params(), &compile_s_).at("loss"), 0);
  }

  double flops(const Batch& b) const override {
    return training_flops_per_token(*o_.model, b.seq_len, o_.trainable) *
           double(b.batch_size * b.seq_len);
  }

 private:
  ParamSource params() const { return o_.source(); }

  Graph graph(int64_t rows, int64_t T, bool packed, const TrainablePredicate& trainable,
              const LlamaOptions& llama) const {
    TrainingGraphOptions g;
    g.batch_size = rows;
    g.seq_len = T;
    g.packed = packed;
    g.trainable = trainable;
    g.llama = llama;
    g.dtype = o_.dtype;
    return build_training_graph(*o_.model, g).graph;
  }

  ModelStepOptions o_;
  // Training and validation graphs run one after the other: one arena serves both.
  std::shared_ptr<SharedArena> arena_ = std::make_shared<SharedArena>();
  CompiledGraphs graphs_, eval_;
  GradientHook hook_;  // stream_gradients
};

}  // namespace

std::unique_ptr<TrainingStep> make_sft_step(ModelStepOptions opts) {
  return std::make_unique<SftStep>(std::move(opts));
}

}  // namespace fusetune
