#pragma once
// The GRPO policy loss (Shao et al. 2024) over per-token log-probabilities, as a graph
// (docs/design.md §11). With r = exp(logp - old_logp) per completion token, A the token's
// sequence advantage (grpo_normalization.h), and the k3 estimator of KL(pi || ref)
//   kl = exp(ref - logp) - (ref - logp) - 1,
// the per-token loss is
//   l = -min(r A, clip(r, 1 - epsilon, 1 + epsilon_high) A) + beta kl
// and the loss is sum_t w_t l_t, the weights w carrying the mask and each variant's
// normalization (grpo_token_weights). With old_logp the rollout's own log-probs the first
// update has r = 1: clipping acts only from the second of `num_iterations` updates on.
//
// Components: TRL's GRPOTrainer loss by `loss_type` (grpo, bnpo, dr_grpo, dapo) with `beta`,
// `epsilon`, `epsilon_high`; torchtune's GRPOSimpleLoss (`kl_coeff` = beta, `epsilon` both
// sides, the grpo normalization): on its single update r = 1 and the loss's value and gradient
// are torchtune's exp(logp - logp.detach()) form.
#include <string>

#include "fusetune/graph/builder.h"

namespace fusetune {

enum class GrpoLossType { GRPO, BNPO, DrGRPO, DAPO };

struct GrpoLoss {
  GrpoLossType type = GrpoLossType::GRPO;
  double epsilon = 0.2;       // the ratio is clipped below at 1 - epsilon
  double epsilon_high = 0.2;  // and above at 1 + epsilon_high
  double beta = 0.0;          // the KL coefficient; 0: no reference model is loaded
  // The sampling temperature: log-probs are those of softmax(logits / temperature), the
  // distribution the completions were drawn from (TRL and torchtune score them so).
  double temperature = 1.0;
  bool needs_reference() const { return beta != 0.0; }
  // Whether the clipped term is the one taken at (ratio, advantage): TRL's clip ratio.
  bool clipped(double ratio, double advantage) const {
    return (ratio < 1.0 - epsilon && advantage < 0) ||
           (ratio > 1.0 + epsilon_high && advantage > 0);
  }
};

// "grpo", "bnpo", "dr_grpo", "dapo"; the parse names the choices when `name` is none of them.
const char* grpo_loss_type_name(GrpoLossType type);
GrpoLossType grpo_loss_type_from(const std::string& name, const std::string& key);

// Per-token label log-probs [N]: log_softmax of the logits (h W^T, or `logits` when the model
// computed them) divided by `temperature`, gathered at the labels, 0 where the label is -100.
// The temperature scales h (h / t W^T = h W^T / t), so under compile: true the head,
// log_softmax and gather still fuse (compile/fuse_linear_log_probs): no [N, vocab] tensor.
Value build_token_log_probs(Builder& b, Value hidden, Value head, Value logits, Value labels,
                            double temperature = 1.0);

// [N] each; ref_logps unused (may be invalid) when beta is 0.
struct GrpoLossInputs {
  Value logps, old_logps, ref_logps, advantages, weights;
};
struct GrpoLossOutputs {
  Value loss;   // []
  Value ratio;  // [N], for the clip fraction
  Value kl;     // [N] (invalid when beta is 0)
};
GrpoLossOutputs build_grpo_loss(Builder& b, const GrpoLoss& loss, const GrpoLossInputs& in);

}  // namespace fusetune
