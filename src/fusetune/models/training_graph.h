#pragma once
// The joint training step as one graph: model forward + loss + backward (docs/design.md §1, §7).
// Inputs (bound by name each step): "tokens", "labels", "positions" [B, T] I32, "doc_ids"
// [B, T] I32 when packed, "loss_scale" [] (1 / the loss units of the optimizer step), and any
// inputs the loss adds. Outputs, by name: "loss", then "grad:<param>" for every trainable
// parameter, then "report:<name>" for every tensor the loss reports (metrics).
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fusetune/graph/graph.h"
#include "fusetune/models/llama.h"

namespace fusetune {

// What a loss component sees of the model and the step.
struct LossContext {
  LlamaOutputs model;  // hidden + head, or logits
  Value labels;        // [B*T] I32, shifted by the data layer
  Value scale;         // []
  int64_t batch_size = 0, seq_len = 0;
};
struct LossOutputs {
  Value loss;                                         // the scalar to differentiate
  std::vector<std::pair<std::string, Value>> report;  // named tensors for the metrics
};
// Builds the loss into the graph (it may add inputs of its own).
using LossBuilder = std::function<LossOutputs(Builder& b, const LossContext& ctx)>;

// The default loss: mean token cross-entropy (losses/cross_entropy.h).
LossOutputs cross_entropy_loss(Builder& b, const LossContext& ctx);

struct PreferenceLoss;
// A preference loss (losses/preference.h) over 2B rows, chosen then rejected. Its inputs:
// "response_mask" [2B*T], "ref_logps" [2B] (unless reference-free), "inv_response_len" [2B]
// (length-normalized losses), "kto_kl" [] (KTO). It reports "chosen_rewards",
// "rejected_rewards" [B], "policy_logps" and "logit_sums" [2B]. Unpaired KTO (loss.unpaired):
// R rows of either kind, the input "desirable" [R]; it reports "rewards" [R] instead.
LossBuilder preference_loss_builder(const PreferenceLoss& loss);

struct DistillationLoss;
struct KdStudentHead;
// Knowledge distillation (losses/distillation.h): (1 - kd_ratio) CE + kd_ratio KD against
// the input "teacher_logits" [B*T, V] (the teacher's forward, run by the step). It reports
// "ce_sum" and "kd_sum" [] (unscaled sums over the unmasked labels).
LossBuilder distillation_loss_builder(const DistillationLoss& loss, double kd_ratio);
// The same fused with both LM heads (`compile: true`, losses/distillation.h:
// build_fused_kd_loss): inputs "teacher_hidden" [B*T, teacher_dim] (the teacher's final norm)
// and "teacher_head" [V, teacher_dim] instead of the teacher's logits. The student's head is
// its own lm_head, or, when `head` is set, the parts a head hook recorded there as the model
// was built (LoRA on lm_head, an NF4 head: peft::head_parts_hook), the hook computing no logits.
// With teacher_top_k = K > 0 the teacher is its top-k instead (precomputed teacher logits):
// inputs "teacher_topk_ids" [B*T, K] I32 and "teacher_topk_logprobs" [B*T, K] (the compute
// dtype: F32 in a bf16 graph), no teacher
// hidden states or head (teacher_dim unused).
LossBuilder fused_distillation_loss_builder(const DistillationLoss& loss, double kd_ratio,
                                            int64_t teacher_dim,
                                            std::shared_ptr<const KdStudentHead> head = nullptr,
                                            int64_t teacher_top_k = 0);

struct RewardLoss;
// A reward model's loss (losses/reward.h) over 2B rows of a sequence classifier, chosen then
// rejected. Its inputs: "last_token_mask" [2B*T] (1 at each row's last real token) and
// "margins" [B]. It reports "chosen_rewards" and "rejected_rewards" [B] (docs/design.md §12).
LossBuilder reward_loss_builder(const RewardLoss& loss);

struct TrainingGraphOptions {
  int64_t batch_size = 1;
  int64_t seq_len = 1;
  bool packed = false;
  DType dtype = DType::F32;
  TrainablePredicate trainable = [](const std::string&) { return true; };
  LlamaOptions llama;  // linear-layer hooks (PEFT adapters, NF4 base weights)
  LossBuilder loss;    // empty: cross_entropy_loss
};

struct TrainingGraph {
  Graph graph;
  std::vector<std::string> trainable_params;  // in the order of the "grad:" outputs
};

TrainingGraph build_training_graph(const ModelConfig& cfg, const TrainingGraphOptions& opts);

// Forward only, returning "logits" [B*T, V] (for evaluation, generation and golden checks).
Graph build_logits_graph(const ModelConfig& cfg, int64_t batch_size, int64_t seq_len, DType dtype,
                         const LlamaOptions& llama = {});

// Forward only to the final norm, returning "hidden" [B*T, D] (a KD teacher under
// `compile: true`: its head runs inside the fused divergence).
Graph build_hidden_graph(const ModelConfig& cfg, int64_t batch_size, int64_t seq_len, DType dtype);

// Forward only, for a sequence classifier (a reward model scoring, evaluation): inputs
// "tokens", "positions" [rows, T] and "last_token_mask" [rows*T]; output "scores"
// [rows, num_labels], each row's score at its last real token (docs/design.md §12).
Graph build_sequence_scores_graph(const ModelConfig& cfg, int64_t rows, int64_t seq_len,
                                  DType dtype);

// Forward only, for a preference reference model and for evaluation: inputs "tokens",
// "labels", "positions" [rows, T] (and "doc_ids" when packed) and "response_mask" [rows*T];
// outputs "logps" [rows] (summed response-token log-probs per row) and "logit_sums" [rows]
// (losses/preference.h). Under compile: true the head and log-softmax are fused
// (FusedLinearLogProbs): no [tokens x vocab] tensor.
Graph build_sequence_log_probs_graph(const ModelConfig& cfg, int64_t rows, int64_t seq_len,
                                     DType dtype, const LlamaOptions& llama = {},
                                     bool packed = false);

}  // namespace fusetune
