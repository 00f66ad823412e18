#pragma once
// Knowledge distillation's loss (torchtune's knowledge_distillation_single_device):
//   loss = (1 - kd_ratio) CE(student, labels) + kd_ratio KD(student, teacher)
// both summed over the tokens whose label is not -100 and times `scale` (1 / those tokens in
// the optimizer step), so each term is torchtune's per-token mean. Written as PyTorch eager
// runs it: the student's logits h W^T materialized (region 0), log_softmax + nll and the
// divergence over [tokens x vocab] logits in the loss region (1). The divergences are
// kernels/cpu/divergence.h's: torchtune's ForwardKLLoss and ReverseKLLoss, TRL's generalized
// JSD, with a temperature.
#include <vector>

#include "fusetune/graph/builder.h"

namespace fusetune {

// The values are kernels::DivergenceKind's (the op's attrs.groups).
enum class KdDivergence : int { ForwardKL = 0, ReverseKL = 1, GeneralizedJSD = 2 };

struct DistillationLoss {
  KdDivergence kind = KdDivergence::ForwardKL;
  double beta = 0.5;         // GeneralizedJSD: the mixture's teacher weight
  double temperature = 1.0;  // divides both models' logits
  const char* name() const;  // "ForwardKLLoss", ...
};

// The divergence of the student's logits [N, V] from the teacher's [N, V] (a constant),
// summed over rows whose label is not -100. Nodes in the loss region.
Value build_divergence(Builder& b, const DistillationLoss& loss, Value student_logits,
                       Value teacher_logits, Value labels);

struct KdLossOutputs {
  Value loss;    // [] the scalar to differentiate
  Value ce_sum;  // [] the summed cross-entropy (unscaled), for the class_loss metric
  Value kd_sum;  // [] the summed divergence (unscaled), for the kd_loss metric
};
// The student's head: hidden [N, D] and head [V, D], or its logits [N, V] when the model
// computed them itself (a LoRA head). teacher_logits [N, V], labels [N] I32, scale [].
KdLossOutputs build_kd_loss(Builder& b, const DistillationLoss& loss, double kd_ratio, Value hidden,
                            Value head, Value logits, Value teacher_logits, Value labels,
                            Value scale);

// The student's LM head as the fused kernel takes it (ops/distillation.h): its weight [V, D]
// (dense, bf16 or the tied embedding; trainable or frozen), or an NF4 head's three parts; and
// optionally a LoRA term, A [r, D] and scale * B [V, r] (LoRA on lm_head).
struct KdStudentHead {
  Value weight;
  std::vector<Value> nf4;  // codes, absmax codes, absmax scales (with nf4_shape = [V, D])
  Shape nf4_shape;
  float nf4_offset = 0;
  Value lora_A, lora_B_scaled;
  Value lora_x;     // [N, D] the LoRA term's own input (lora_dropout: dropout(h)); or none
  Value col_scale;  // [V] DoRA's magnitude / ||W + s B A||_row; or none
};

// The teacher as the fused kernel takes it (constants): its final hidden states [N, Dt] and
// head [V, Dt], or (top_k > 0) its top-k token ids [N, K] I32 and their log-probs [N, K]
// (precomputed teacher logits, docs/distillation.md).
struct KdTeacher {
  Value hidden, head;
  Value topk_ids, topk_logprobs;
  int64_t top_k = 0;
};

// The same under `compile: true` from the student's final hidden states [N, D] and head and
// the teacher's: one FusedLinearDivergence (kernels/cpu/fused_linear_divergence.h) forms both
// chunks of logits, the CE and the divergence chunk by chunk, so neither [N, V] tensor exists.
KdLossOutputs build_fused_kd_loss(Builder& b, const DistillationLoss& loss, double kd_ratio,
                                  Value hidden, const KdStudentHead& head, const KdTeacher& teacher,
                                  Value labels, Value scale);

}  // namespace fusetune
