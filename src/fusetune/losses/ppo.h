#pragma once
// PPO's loss (Schulman et al. 2017, eq. 7; torchtune's PPOLoss; docs/design.md §11), split in
// its two independent parts: the policy part depends on the policy's weights only and the value
// part on the value model's only, so each trains in its own graph (models/ppo_graph.h) and the
// sum of their gradients is PPOLoss's.
//
// Policy part, per response token with r = exp(logp - old_logp) and A the whitened advantage:
//   max(-A r, -A clip(r, 1 - epsilon, 1 + epsilon)) = -min(A r, A clip(r))
// masked-meaned over the micro-batch's response tokens: GRPO's clipped term with beta = 0
// (losses/grpo.h), which the policy graph reuses.
//
// Value part, per value position with v the value, v_old the rollout's, R the return:
//   0.5 max((v - R)^2, (clamp(v, v_old - c, v_old + c) - R)^2)
// masked-meaned over the value positions and weighted by value_coeff.
//
// PPOLoss returns loss = policy_loss + value_coeff * value_loss; torchtune's recipe divides it by
// gradient_accumulation_steps before the backward: the token weights carry that division.
#include "fusetune/graph/builder.h"

namespace fusetune {

struct PpoLoss {
  double epsilon = 0.1;           // the ratio's clip range
  double value_clip_range = 0.2;  // c: how far a value may move from the rollout's
  double value_coeff = 0.1;       // the value loss's weight
  // Whether the clipped policy term is the one taken (torchtune's clipfrac).
  bool clipped(double ratio, double advantage) const {
    return (ratio < 1.0 - epsilon && advantage < 0) || (ratio > 1.0 + epsilon && advantage > 0);
  }
};

// [N] each. `weights`: 1 / (value positions + 1e-8) / accumulation steps at the value
// positions, else 0 (the masked mean).
struct PpoValueLossInputs {
  Value values, old_values, returns, weights;
};
struct PpoValueLossOutputs {
  Value value_loss;  // [] 0.5 sum w max(...): torchtune's value_loss (over the accumulation)
  Value loss;        // [] value_coeff * value_loss: what the value graph differentiates
};
PpoValueLossOutputs build_ppo_value_loss(Builder& b, const PpoLoss& loss,
                                         const PpoValueLossInputs& in);

}  // namespace fusetune
