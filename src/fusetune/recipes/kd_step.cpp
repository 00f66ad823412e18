#include "fusetune/recipes/kd_step.h"

#include "fusetune/models/flops.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

// Under `compile: true` both LM heads run inside the fused divergence (docs/design.md §3):
// the teacher's forward stops at its final norm and no [tokens x vocab] tensor exists.
bool fuses_heads(const KdStepOptions& o) {
  return kd_fuses_heads(o.student.passes.mode, o.student.llama, *o.student.model, *o.teacher) &&
         (!o.student.eval_llama || !o.student.eval_llama->head);
}

class KdStep final : public TrainingStep {
 public:
  explicit KdStep(KdStepOptions o)
      : o_(std::move(o)),
        fused_(fuses_heads(o_)),
        student_([this](int64_t rows, int64_t T,
                        bool) { return graph(rows, T, o_.student.trainable, o_.student.llama); },
                 o_.student.passes, arena_),
        eval_(
            [this](int64_t rows, int64_t T, bool) {
              return graph(
                  rows, T, [](const std::string&) { return false; },
                  o_.student.eval_llama ? *o_.student.eval_llama : o_.student.llama);
            },
            o_.student.passes, arena_),
        teacher_(
            [this](int64_t rows, int64_t T, bool) {
              return fused_ ? build_hidden_graph(*o_.teacher, rows, T, o_.student.dtype)
                            : build_logits_graph(*o_.teacher, rows, T, o_.student.dtype);
            },
            o_.student.passes, arena_) {
    FT_CHECK(o_.teacher && o_.teacher_params, "knowledge distillation needs a teacher model");
    FT_CHECK(o_.teacher->vocab_size == o_.student.model->vocab_size,
             "knowledge distillation: the student's and the teacher's vocabularies differ");
  }

  int64_t loss_units(const Batch& b) const override { return b.num_valid_labels(); }

  StepOutputs run(const Batch& b, double loss_scale, int64_t step, int64_t micro) override {
    TensorMap in = inputs(b, loss_scale);
    if (o_.student.add_inputs) o_.student.add_inputs(in, step, micro);
    TensorMap out = student_.run(b, in, params(), &compile_s_, hook_);
    StepOutputs r;
    r.loss = element_as_double(out.at("loss"), 0);
    r.grads = gradients_of(out);
    const double tokens = double(b.num_valid_labels());
    r.metrics = {{"class_loss", element_as_double(out.at("report:ce_sum"), 0), tokens},
                 {"kd_loss", element_as_double(out.at("report:kd_sum"), 0), tokens}};
    return r;
  }

  bool stream_gradients(GradientHook hook) override {
    hook_ = std::move(hook);
    return true;
  }

  std::vector<std::string> gradient_order(const Batch& b) override {
    return student_.gradient_order(b, &compile_s_);
  }

  // The mixed loss summed over `b`'s unmasked labels, no gradients, no dropout.
  double evaluate(const Batch& b) override {
    return element_as_double(eval_.run(b, inputs(b, 1.0), params(), &compile_s_).at("loss"), 0);
  }

  // The student's training step plus the teacher's forward (half of what a frozen model's
  // forward and input gradients cost).
  double flops(const Batch& b) const override {
    const auto frozen = [](const std::string&) { return false; };
    const double per_token =
        training_flops_per_token(*o_.student.model, b.seq_len, o_.student.trainable) +
        0.5 * training_flops_per_token(*o_.teacher, b.seq_len, frozen);
    return per_token * double(b.batch_size * b.seq_len);
  }

 private:
  // The batch's tensors, the loss scale and the teacher's logits for the batch.
  TensorMap inputs(const Batch& b, double loss_scale) {
    FT_CHECK(b.doc_ids.empty(),
             "knowledge distillation does not take packed batches yet (dataset.packed: false)");
    TensorMap in = batch_inputs(b);
    in["loss_scale"] = scalar_input(loss_scale, DType::F32);
    TensorMap teacher_in{{"tokens", in.at("tokens")}, {"positions", in.at("positions")}};
    TensorMap t = teacher_.run(b, teacher_in, ParamSource(*o_.teacher_params), &compile_s_);
    if (fused_) {
      in["teacher_hidden"] = t.at("hidden");
      in["teacher_head"] = o_.teacher_params->at(
          o_.teacher->tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
    } else {
      in["teacher_logits"] = t.at("logits");
    }
    return in;
  }

  ParamSource params() const {
    return o_.student.param_source ? *o_.student.param_source : ParamSource(*o_.student.params);
  }

  Graph graph(int64_t rows, int64_t T, const TrainablePredicate& trainable,
              const LlamaOptions& llama) const {
    TrainingGraphOptions g;
    g.batch_size = rows;
    g.seq_len = T;
    g.trainable = trainable;
    g.llama = llama;
    g.dtype = o_.student.dtype;
    g.loss = fused_ ? fused_distillation_loss_builder(o_.loss, o_.kd_ratio, o_.teacher->hidden_size)
                    : distillation_loss_builder(o_.loss, o_.kd_ratio);
    return build_training_graph(*o_.student.model, g).graph;
  }

  KdStepOptions o_;
  bool fused_ = false;  // fuses_heads(o_)
  // The teacher's, the student's and the validation graphs run one after the other: one arena
  // serves all three.
  std::shared_ptr<SharedArena> arena_ = std::make_shared<SharedArena>();
  CompiledGraphs student_, eval_, teacher_;
  GradientHook hook_;  // stream_gradients
};

}  // namespace

bool kd_fuses_heads(CompileMode mode, const LlamaOptions& student, const ModelConfig& student_model,
                    const ModelConfig& teacher) {
  return mode == CompileMode::Full && !student.head && student_model.final_logit_softcapping == 0 &&
         teacher.final_logit_softcapping == 0;
}

std::unique_ptr<TrainingStep> make_kd_step(KdStepOptions opts) {
  return std::make_unique<KdStep>(std::move(opts));
}

}  // namespace fusetune
