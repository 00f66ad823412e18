#include "fusetune/recipes/kd_step.h"

#include "fusetune/kernels/cpu/fused_linear_divergence.h"
#include "fusetune/models/flops.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

// Under `compile: true` both LM heads run inside the fused divergence (docs/design.md §3):
// the teacher's forward stops at its final norm and no [tokens x vocab] tensor exists.
bool fuses_heads(const KdStepOptions& o) {
  // A precomputed teacher has no head in the step: only the student's counts.
  const ModelConfig& teacher = o.teacher ? *o.teacher : *o.student.model;
  return kd_fuses_heads(o.student.passes.mode, o.student.llama, *o.student.model, teacher,
                        bool(o.head_parts), o.teacher_top_k > 0);
}

// The teacher's top-k [N, K] of its final hidden states h [N, Dt] and head (its dtype's).
// A soft-capping teacher (Gemma 2: final_logit_softcapping = cap) has the log-probs of its
// capped logits.
void top_k_of_hidden(const Tensor& h, const Tensor& head, int64_t K, double cap, Tensor& ids,
                     Tensor& logprobs) {
  const int64_t N = h.dim(0), D = h.dim(1), V = head.dim(0);
  ids = Tensor::empty({N, K}, DType::I32);
  constexpr int64_t kRows = 64;  // a [64, V] block of logits at a time
  if (h.dtype() == DType::F64) {
    logprobs = Tensor::empty({N, K}, DType::F64);
    kernels::teacher_top_k<double>(h.data<double>(), head.data<double>(), nullptr, N, D, V, K,
                                   kRows, ids.data<int32_t>(), logprobs.data<double>(), cap);
    return;
  }
  const Tensor h32 = h.to(DType::F32);
  logprobs = Tensor::empty({N, K}, DType::F32);
  const bool bf16 = head.dtype() == DType::BF16;
  kernels::teacher_top_k<float>(h32.data<float>(), bf16 ? nullptr : head.data<float>(),
                                bf16 ? head.data<uint16_t>() : nullptr, N, D, V, K, kRows,
                                ids.data<int32_t>(), logprobs.data<float>(), cap);
}

// Dense teacher logits [N, V] in `dtype` from its top-k: the log-probs on the ids,
// kTopKFloorLogit elsewhere (the unfused graph's input; its softmax renormalizes them).
Tensor dense_top_k_logits(const Tensor& ids, const Tensor& logprobs, int64_t V, DType dtype) {
  const int64_t N = ids.dim(0), K = ids.dim(1);
  const Tensor lp = logprobs.to(DType::F64);
  Tensor z = Tensor::empty({N, V}, DType::F64);
  for (int64_t i = 0; i < N; ++i)
    kernels::scatter_top_k<double>(ids.data<int32_t>() + i * K, lp.data<double>() + i * K, K, V,
                                   z.data<double>() + i * V);
  return z.to(dtype);
}

class KdStep final : public TrainingStep {
 public:
  explicit KdStep(KdStepOptions o)
      : o_(std::move(o)),
        fused_(fuses_heads(o_)),
        student_(
            [this](int64_t rows, int64_t T, bool) {
              return graph(rows, T, o_.student.trainable, student_llama(false));
            },
            o_.student.passes, arena_),
        eval_(
            [this](int64_t rows, int64_t T, bool) {
              return graph(
                  rows, T, [](const std::string&) { return false; }, student_llama(true));
            },
            o_.student.passes, arena_),
        teacher_(
            [this](int64_t rows, int64_t T, bool) {
              // A top-k teacher keeps its top-k from its hidden states and head, chunk by chunk.
              return fused_ || o_.teacher_top_k > 0
                         ? build_hidden_graph(*o_.teacher, rows, T, o_.student.dtype)
                         : build_logits_graph(*o_.teacher, rows, T, o_.student.dtype);
            },
            o_.student.passes, arena_) {
    if (o_.precomputed) {
      FT_CHECK(o_.teacher_top_k == o_.precomputed->top_k(),
               "knowledge distillation: the precomputed file's top_k is not the step's");
      return;
    }
    FT_CHECK(o_.teacher && o_.teacher_params, "knowledge distillation needs a teacher model");
    FT_CHECK(o_.teacher->vocab_size == o_.student.model->vocab_size,
             "knowledge distillation: the student's and the teacher's vocabularies differ");
  }

  int64_t loss_units(const Batch& b) const override { return b.num_valid_labels(); }

  StepOutputs run(const Batch& b, double loss_scale, int64_t step, int64_t micro) override {
    TensorMap in = inputs(b, loss_scale, o_.precomputed.get());
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
    // A precomputed teacher: the validation samples' own file (their top-k, as training's).
    FT_CHECK(!o_.precomputed || o_.precomputed_val,
             "knowledge distillation: validation with a precomputed teacher needs the validation "
             "samples' file");
    const TensorMap in = inputs(b, 1.0, o_.precomputed_val.get());
    return element_as_double(eval_.run(b, in, params(), &compile_s_).at("loss"), 0);
  }

  // The student's training step plus the teacher's forward (half of what a frozen model's
  // forward and input gradients cost).
  double flops(const Batch& b) const override {
    const auto frozen = [](const std::string&) { return false; };
    double per_token = training_flops_per_token(*o_.student.model, b.seq_len, o_.student.trainable);
    if (!o_.precomputed)
      per_token += 0.5 * training_flops_per_token(*o_.teacher, b.seq_len, frozen);
    return per_token * double(b.batch_size * b.seq_len);
  }

 private:
  // The batch's tensors, the loss scale and the teacher's logits for the batch (a precomputed
  // teacher: from `file`, the file of b's dataset).
  TensorMap inputs(const Batch& b, double loss_scale, const TeacherTopK* file) {
    FT_CHECK(b.doc_ids.empty(),
             "knowledge distillation does not take packed batches yet (dataset.packed: false)");
    TensorMap in = batch_inputs(b);
    in["loss_scale"] = scalar_input(loss_scale, DType::F32);
    if (o_.teacher_top_k > 0) {
      add_top_k_teacher(b, file, in);
      return in;
    }
    TensorMap t = run_teacher(b, in);
    if (fused_) {
      in["teacher_hidden"] = t.at("hidden");
      in["teacher_head"] = teacher_head();
    } else {
      in["teacher_logits"] = t.at("logits");
    }
    return in;
  }

  ParamSource teacher_params() const {
    return o_.teacher_source ? *o_.teacher_source : ParamSource(*o_.teacher_params);
  }

  TensorMap run_teacher(const Batch& b, const TensorMap& in) {
    TensorMap teacher_in{{"tokens", in.at("tokens")}, {"positions", in.at("positions")}};
    return teacher_.run(b, teacher_in, teacher_params(), &compile_s_);
  }

  // The teacher's head for the fused kernel or its top-k (ZeRO-3: gathered from its owner, a
  // collective every rank makes at the same point of the step).
  Tensor teacher_head() const {
    const std::string name =
        o_.teacher->tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    return o_.teacher_source ? o_.teacher_source->acquire(name) : o_.teacher_params->at(name);
  }

  // The teacher's top-k for b (the file's, or from its forward now): to the fused kernel as
  // they are, to the unfused graph as dense logits floored outside the top-k.
  void add_top_k_teacher(const Batch& b, const TeacherTopK* file, TensorMap& in) {
    Tensor ids, logprobs;
    if (file)
      file->batch_inputs(b, ids, logprobs);
    else
      top_k_of_hidden(run_teacher(b, in).at("hidden"), teacher_head(), o_.teacher_top_k,
                      o_.teacher->final_logit_softcapping, ids, logprobs);
    const DType compute = compute_dtype(o_.student.dtype);
    if (fused_) {
      in["teacher_topk_ids"] = ids;
      in["teacher_topk_logprobs"] = logprobs.to(compute);
    } else {
      in["teacher_logits"] =
          dense_top_k_logits(ids, logprobs, o_.student.model->vocab_size, o_.student.dtype);
    }
  }

  // The student's hooks for training or validation. When the fused loss takes a head hook's
  // parts, the head hook records them into head_ instead of computing logits.
  LlamaOptions student_llama(bool eval) const {
    LlamaOptions l = eval && o_.student.eval_llama ? *o_.student.eval_llama : o_.student.llama;
    if (fused_ && l.head)
      l.head = (eval && o_.eval_head_parts ? o_.eval_head_parts : o_.head_parts)(head_);
    return l;
  }

  ParamSource params() const { return o_.student.source(); }

  Graph graph(int64_t rows, int64_t T, const TrainablePredicate& trainable,
              const LlamaOptions& llama) const {
    TrainingGraphOptions g;
    g.batch_size = rows;
    g.seq_len = T;
    g.trainable = trainable;
    g.llama = llama;
    g.dtype = o_.student.dtype;
    const int64_t teacher_dim = o_.teacher ? o_.teacher->hidden_size : 0;
    g.loss = fused_
                 ? fused_distillation_loss_builder(o_.loss, o_.kd_ratio, teacher_dim,
                                                   llama.head ? head_ : nullptr, o_.teacher_top_k)
                 : distillation_loss_builder(o_.loss, o_.kd_ratio);
    return build_training_graph(*o_.student.model, g).graph;
  }

  KdStepOptions o_;
  bool fused_ = false;  // fuses_heads(o_)
  // The student head's parts, recorded by the head hook as each graph is built.
  std::shared_ptr<KdStudentHead> head_ = std::make_shared<KdStudentHead>();
  // The teacher's, the student's and the validation graphs run one after the other: one arena
  // serves all three.
  std::shared_ptr<SharedArena> arena_ = std::make_shared<SharedArena>();
  CompiledGraphs student_, eval_, teacher_;
  GradientHook hook_;  // stream_gradients
};

}  // namespace

bool kd_fuses_heads(CompileMode mode, const LlamaOptions& student, const ModelConfig& student_model,
                    const ModelConfig& teacher, bool head_parts, bool teacher_top_k) {
  return mode == CompileMode::Full && (!student.head || head_parts) &&
         student_model.final_logit_softcapping == 0 &&
         (teacher_top_k || teacher.final_logit_softcapping == 0);
}

TopKOfBatch teacher_top_k_of(const ModelConfig& teacher, const TensorMap& params, int64_t top_k,
                             DType dtype, const PassOptions& passes) {
  auto graphs = std::make_shared<CompiledGraphs>(
      [teacher, dtype](int64_t rows, int64_t T, bool) {
        return build_hidden_graph(teacher, rows, T, dtype);
      },
      passes);
  const Tensor& head =
      params.at(teacher.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  const double cap = teacher.final_logit_softcapping;
  return [graphs, &params, &head, top_k, cap](const Batch& b, Tensor& ids, Tensor& logprobs) {
    const TensorMap all = batch_inputs(b);
    const TensorMap in{{"tokens", all.at("tokens")}, {"positions", all.at("positions")}};
    double compile_s = 0;
    top_k_of_hidden(graphs->run(b, in, ParamSource(params), &compile_s).at("hidden"), head, top_k,
                    cap, ids, logprobs);
  };
}

std::unique_ptr<TrainingStep> make_kd_step(KdStepOptions opts) {
  return std::make_unique<KdStep>(std::move(opts));
}

}  // namespace fusetune
