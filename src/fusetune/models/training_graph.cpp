#include "fusetune/models/training_graph.h"

#include "fusetune/graph/autodiff.h"
#include "fusetune/graph/verifier.h"
#include "fusetune/losses/cross_entropy.h"
#include "fusetune/losses/distillation.h"
#include "fusetune/losses/preference.h"
#include "fusetune/losses/reward.h"
#include "fusetune/util/error.h"

namespace fusetune {

LossOutputs cross_entropy_loss(Builder& b, const LossContext& c) {
  FT_CHECK(!c.model.scores.valid(),
           "the model is a sequence classifier (config.json's architectures names a "
           "*ForSequenceClassification): it has a score head, no LM head to train with "
           "cross-entropy; train it with reward_model_finetune_single_device");
  LossOutputs out;
  out.loss = c.model.logits.valid()
                 ? build_cross_entropy_from_logits(b, c.model.logits, c.labels, c.scale)
                 : build_cross_entropy(b, c.model.hidden, c.model.lm_head, c.labels, c.scale);
  return out;
}

LossBuilder preference_loss_builder(const PreferenceLoss& loss) {
  return [loss](Builder& b, const LossContext& c) {
    Graph& g = b.graph();
    const int64_t rows = c.batch_size, N = rows * c.seq_len;
    const DType fd = g.compute_dtype();  // data inputs are fp32 in a bf16 graph
    Value mask = g.input("response_mask", {N}, fd);
    Value inv_len = loss.length_normalized() ? g.input("inv_response_len", {rows}, fd) : Value{};
    Value ref = loss.needs_reference() ? g.input("ref_logps", {rows}, fd) : Value{};
    SequenceLogProbs s = build_sequence_log_probs(b, c.model.hidden, c.model.lm_head,
                                                  c.model.logits, c.labels, mask, rows);
    Value kl = loss.kind == PreferenceLossKind::KTO ? g.input("kto_kl", {}, fd) : Value{};
    Value desirable = loss.unpaired ? g.input("desirable", {rows}, fd) : Value{};
    PreferenceLossOutputs l =
        build_preference_loss(b, loss, s.logps, ref, inv_len, c.scale, kl, desirable);
    LossOutputs out;
    out.loss = l.loss;
    if (loss.unpaired)
      out.report = {{"rewards", l.rewards}};
    else
      out.report = {{"chosen_rewards", l.chosen_rewards}, {"rejected_rewards", l.rejected_rewards}};
    out.report.push_back({"policy_logps", s.logps});
    out.report.push_back({"logit_sums", s.logit_sums});
    return out;
  };
}

LossBuilder reward_loss_builder(const RewardLoss& loss) {
  return [loss](Builder& b, const LossContext& c) {
    Graph& g = b.graph();
    FT_CHECK(c.model.scores.valid(),
             "a reward model is a sequence classifier: its config needs num_labels (a "
             "*ForSequenceClassification checkpoint, or model.num_labels)");
    const int64_t rows = c.batch_size, N = rows * c.seq_len;
    const DType fd = g.compute_dtype();
    Value last = g.input("last_token_mask", {N}, fd);
    Value margins = g.input("margins", {rows / 2}, fd);
    Value scores = build_last_token_scores(b, c.model.scores, last, rows);  // [rows, L]
    FT_CHECK(b.shape(scores)[1] == 1, "a reward model has one score (num_labels: 1), this one " +
                                          std::to_string(b.shape(scores)[1]));
    RewardLossOutputs l = build_reward_loss(b, loss, b.reshape(scores, {rows}), margins, c.scale);
    LossOutputs out;
    out.loss = l.loss;
    out.report = {{"chosen_rewards", l.chosen_rewards}, {"rejected_rewards", l.rejected_rewards}};
    return out;
  };
}

LossBuilder distillation_loss_builder(const DistillationLoss& loss, double kd_ratio) {
  return [loss, kd_ratio](Builder& b, const LossContext& c) {
    Graph& g = b.graph();
    const int64_t N = c.batch_size * c.seq_len;
    const int64_t V = g.shape(
        c.model.logits.valid() ? c.model.logits : c.model.lm_head)[c.model.logits.valid() ? 1 : 0];
    Value teacher = g.input("teacher_logits", {N, V}, g.float_dtype());
    KdLossOutputs l = build_kd_loss(b, loss, kd_ratio, c.model.hidden, c.model.lm_head,
                                    c.model.logits, teacher, c.labels, c.scale);
    LossOutputs out;
    out.loss = l.loss;
    out.report = {{"ce_sum", l.ce_sum}, {"kd_sum", l.kd_sum}};
    return out;
  };
}

LossBuilder fused_distillation_loss_builder(const DistillationLoss& loss, double kd_ratio,
                                            int64_t teacher_dim,
                                            std::shared_ptr<const KdStudentHead> head,
                                            int64_t teacher_top_k) {
  return [loss, kd_ratio, teacher_dim, head, teacher_top_k](Builder& b, const LossContext& c) {
    Graph& g = b.graph();
    FT_CHECK(head || !c.model.logits.valid(),
             "the fused distillation loss needs the student's own LM head or its parts");
    KdStudentHead own;
    own.weight = c.model.lm_head;
    const KdStudentHead& h = head ? *head : own;
    FT_CHECK(h.weight.valid() || !h.nf4.empty(),
             "the fused distillation loss: the student's head hook recorded no head");
    const int64_t N = c.batch_size * c.seq_len;
    const int64_t V = h.nf4.empty() ? g.shape(h.weight)[0] : h.nf4_shape[0];
    KdTeacher t;
    t.top_k = teacher_top_k;
    if (teacher_top_k > 0) {
      t.topk_ids = g.input("teacher_topk_ids", {N, teacher_top_k}, DType::I32);
      t.topk_logprobs = g.input("teacher_topk_logprobs", {N, teacher_top_k}, g.compute_dtype());
    } else {
      t.hidden = g.input("teacher_hidden", {N, teacher_dim}, g.float_dtype());
      t.head = g.input("teacher_head", {V, teacher_dim}, g.float_dtype());
    }
    KdLossOutputs l =
        build_fused_kd_loss(b, loss, kd_ratio, c.model.hidden, h, t, c.labels, c.scale);
    LossOutputs out;
    out.loss = l.loss;
    out.report = {{"ce_sum", l.ce_sum}, {"kd_sum", l.kd_sum}};
    return out;
  };
}

TrainingGraph build_training_graph(const ModelConfig& cfg, const TrainingGraphOptions& o) {
  TrainingGraph tg{Graph(o.dtype), {}};
  Graph& g = tg.graph;
  Builder b(g);
  const int64_t B = o.batch_size, T = o.seq_len;
  LlamaInputs in;
  in.tokens = g.input("tokens", {B, T}, DType::I32);
  Value labels = g.input("labels", {B, T}, DType::I32);
  in.positions = g.input("positions", {B, T}, DType::I32);
  if (o.packed) in.doc_ids = g.input("doc_ids", {B, T}, DType::I32);
  Value scale = g.input("loss_scale", {}, compute_dtype(o.dtype));

  LossContext ctx;
  ctx.model = build_llama(b, cfg, in, o.trainable, o.llama);
  ctx.labels = b.reshape(labels, {B * T});
  ctx.scale = scale;
  ctx.batch_size = B;
  ctx.seq_len = T;
  LossOutputs loss = o.loss ? o.loss(b, ctx) : cross_entropy_loss(b, ctx);
  g.mark_output("loss", loss.loss);
  for (auto& [name, grad] : append_backward(g, loss.loss)) tg.trainable_params.push_back(name);
  for (const auto& [name, v] : loss.report) g.mark_output("report:" + name, v);
  verify_graph(g);
  return tg;
}

Graph build_logits_graph(const ModelConfig& cfg, int64_t batch_size, int64_t seq_len, DType dtype,
                         const LlamaOptions& llama) {
  Graph g(dtype);
  Builder b(g);
  LlamaInputs in;
  in.tokens = g.input("tokens", {batch_size, seq_len}, DType::I32);
  in.positions = g.input("positions", {batch_size, seq_len}, DType::I32);
  LlamaOutputs m = build_llama(
      b, cfg, in, [](const std::string&) { return false; }, llama);
  g.mark_output("logits", m.logits.valid() ? m.logits : b.matmul(m.hidden, m.lm_head, false, true));
  verify_graph(g);
  return g;
}

Graph build_hidden_graph(const ModelConfig& cfg, int64_t batch_size, int64_t seq_len, DType dtype) {
  Graph g(dtype);
  Builder b(g);
  LlamaInputs in;
  in.tokens = g.input("tokens", {batch_size, seq_len}, DType::I32);
  in.positions = g.input("positions", {batch_size, seq_len}, DType::I32);
  LlamaOutputs m = build_llama(b, cfg, in, [](const std::string&) { return false; });
  g.mark_output("hidden", m.hidden);
  verify_graph(g);
  return g;
}

Graph build_sequence_scores_graph(const ModelConfig& cfg, int64_t rows, int64_t seq_len,
                                  DType dtype) {
  Graph g(dtype);
  Builder b(g);
  LlamaInputs in;
  in.tokens = g.input("tokens", {rows, seq_len}, DType::I32);
  in.positions = g.input("positions", {rows, seq_len}, DType::I32);
  Value last = g.input("last_token_mask", {rows * seq_len}, compute_dtype(dtype));
  LlamaOutputs m = build_llama(b, cfg, in, [](const std::string&) { return false; });
  FT_CHECK(m.scores.valid(), "build_sequence_scores_graph: the model is not a sequence classifier");
  g.mark_output("scores", build_last_token_scores(b, m.scores, last, rows));
  verify_graph(g);
  return g;
}

Graph build_sequence_log_probs_graph(const ModelConfig& cfg, int64_t rows, int64_t seq_len,
                                     DType dtype, const LlamaOptions& llama, bool packed) {
  Graph g(dtype);
  Builder b(g);
  LlamaInputs in;
  in.tokens = g.input("tokens", {rows, seq_len}, DType::I32);
  Value labels = g.input("labels", {rows, seq_len}, DType::I32);
  in.positions = g.input("positions", {rows, seq_len}, DType::I32);
  Value mask = g.input("response_mask", {rows * seq_len}, compute_dtype(dtype));
  if (packed) in.doc_ids = g.input("doc_ids", {rows, seq_len}, DType::I32);
  LlamaOutputs m = build_llama(
      b, cfg, in, [](const std::string&) { return false; }, llama);
  SequenceLogProbs s = build_sequence_log_probs(b, m.hidden, m.lm_head, m.logits,
                                                b.reshape(labels, {rows * seq_len}), mask, rows);
  g.mark_output("logps", s.logps);
  g.mark_output("logit_sums", s.logit_sums);
  verify_graph(g);
  return g;
}

}  // namespace fusetune
