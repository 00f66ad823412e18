#pragma once
// Knowledge distillation's loss (torchtune's knowledge_distillation_single_device):
//   loss = (1 - kd_ratio) CE(student, labels) + kd_ratio KD(student, teacher)
// both summed over the tokens whose label is not -100 and times `scale` (1 / those tokens in
// the optimizer step), so each term is torchtune's per-token mean. Written as PyTorch eager
// runs it: the student's logits h W^T materialized (region 0), log_softmax + nll and the
// divergence over [tokens x vocab] logits in the loss region (1). The divergences are
// kernels/cpu/divergence.h's: torchtune's ForwardKLLoss and ReverseKLLoss, TRL's generalized
// JSD, with a temperature.
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

// The same under `compile: true` from both models' final hidden states and heads: one
// FusedLinearDivergence (kernels/cpu/fused_linear_divergence.h) forms both chunks of logits,
// the CE and the divergence chunk by chunk, so neither [N, V] tensor exists. hidden [N, D],
// head [V, D] (the student's own: dense, trainable or frozen, or the tied embedding),
// teacher_hidden [N, Dt], teacher_head [V, Dt] (constants).
KdLossOutputs build_fused_kd_loss(Builder& b, const DistillationLoss& loss, double kd_ratio,
                                  Value hidden, Value head, Value teacher_hidden,
                                  Value teacher_head, Value labels, Value scale);

}  // namespace fusetune
