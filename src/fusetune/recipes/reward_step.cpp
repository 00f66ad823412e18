#include "fusetune/recipes/reward_step.h"

#include <vector>

#include "fusetune/models/flops.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

// A per-pair report output's values, whatever its dtype.
std::vector<double> reward_values(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[size_t(i)] = element_as_double(t, i);
  return v;
}

// "margins" [B]: each pair's margin column (0 when the data has none).
Tensor margins_input(const Batch& b) {
  const int64_t B = b.batch_size / 2;
  Tensor t = Tensor::zeros({B}, DType::F32);
  FT_CHECK(b.margins.empty() || int64_t(b.margins.size()) == B,
           "a preference batch of " + std::to_string(B) + " pairs carries " +
               std::to_string(b.margins.size()) + " margins");
  for (int64_t i = 0; i < int64_t(b.margins.size()); ++i) t.data<float>()[i] = b.margins[size_t(i)];
  return t;
}

class RewardStep final : public TrainingStep {
 public:
  explicit RewardStep(RewardStepOptions o)
      : o_(std::move(o)),
        train_([this](int64_t rows, int64_t T,
                      bool) { return graph(rows, T, o_.model.trainable, o_.model.llama); },
               o_.model.passes, arena_),
        eval_(
            [this](int64_t rows, int64_t T, bool) {
              // Forward and loss only: nothing trains, so autodiff adds no backward.
              return graph(
                  rows, T, [](const std::string&) { return false; },
                  o_.model.eval_llama.value_or(o_.model.llama));
            },
            o_.model.passes, arena_) {
    FT_CHECK(o_.model.model->num_labels == 1,
             "a reward model has one score (num_labels: 1); this classifier has " +
                 std::to_string(o_.model.model->num_labels));
  }

  int64_t loss_units(const Batch& b) const override { return b.batch_size / 2; }

  StepOutputs run(const Batch& b, double loss_scale, int64_t step, int64_t micro) override {
    TensorMap in = inputs(b, loss_scale);
    if (o_.model.add_inputs) o_.model.add_inputs(in, step, micro);
    TensorMap out = train_.run(b, in, params(), &compile_s_);
    StepOutputs r;
    r.loss = element_as_double(out.at("loss"), 0);
    r.grads = gradients_of(out);
    const std::vector<double> rc = reward_values(out.at("report:chosen_rewards"));
    const std::vector<double> rr = reward_values(out.at("report:rejected_rewards"));
    const int64_t B = b.batch_size / 2;
    double chosen = 0, rejected = 0, correct = 0, margin = 0;
    for (int64_t i = 0; i < B; ++i) {
      const size_t k = size_t(i);
      chosen += rc[k];
      rejected += rr[k];
      correct += rc[k] > rr[k] ? 1.0 : 0.0;
      margin += rc[k] - rr[k];
    }
    const double pairs = double(B);
    r.metrics = {{"accuracy", correct, pairs},
                 {"rewards/chosen", chosen, pairs},
                 {"rewards/rejected", rejected, pairs},
                 {"rewards/margins", margin, pairs}};
    return r;
  }

  // The loss of `b`'s pairs summed (loss_scale 1), no gradients.
  double evaluate(const Batch& b) override {
    return element_as_double(eval_.run(b, inputs(b, 1.0), params(), &compile_s_).at("loss"), 0);
  }

  double flops(const Batch& b) const override {
    return training_flops_per_token(*o_.model.model, b.seq_len, o_.model.trainable) *
           double(b.batch_size * b.seq_len);
  }

 private:
  static TensorMap inputs(const Batch& b, double loss_scale) {
    FT_CHECK(b.batch_size % 2 == 0 && b.doc_ids.empty(),
             "a reward model's batch has 2B unpacked rows (chosen, then rejected)");
    TensorMap in = batch_inputs(b);
    in["loss_scale"] = scalar_input(loss_scale, DType::F32);
    in["last_token_mask"] = last_token_mask(b);
    in["margins"] = margins_input(b);
    return in;
  }

  ParamSource params() const { return o_.model.source(); }

  Graph graph(int64_t rows, int64_t T, const TrainablePredicate& trainable,
              const LlamaOptions& llama) const {
    TrainingGraphOptions g;
    g.batch_size = rows;
    g.seq_len = T;
    g.trainable = trainable;
    g.llama = llama;
    g.loss = reward_loss_builder(o_.loss);
    g.dtype = o_.model.dtype;
    return build_training_graph(*o_.model.model, g).graph;
  }

  RewardStepOptions o_;
  std::shared_ptr<SharedArena> arena_ = std::make_shared<SharedArena>();
  CompiledGraphs train_, eval_;
};

}  // namespace

std::unique_ptr<TrainingStep> make_reward_step(RewardStepOptions opts) {
  return std::make_unique<RewardStep>(std::move(opts));
}

Tensor last_token_mask(const Batch& b) {
  const int64_t rows = b.batch_size, T = b.seq_len;
  FT_CHECK(int64_t(b.lengths.size()) == rows,
           "a classifier's batch needs each row's length (collate sets Batch::lengths)");
  Tensor mask = Tensor::zeros({rows * T}, DType::F32);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = b.lengths[size_t(r)];
    FT_CHECK(n >= 1 && n <= T, "row " + std::to_string(r) + " has " + std::to_string(n) +
                                   " tokens; a classifier scores its last one");
    mask.data<float>()[r * T + n - 1] = 1.0f;
  }
  return mask;
}

}  // namespace fusetune
