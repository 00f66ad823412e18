#pragma once
// A reward model's loss (docs/design.md §12): TRL RewardTrainer's Bradley-Terry objective on a
// sequence classifier's scores. A batch holds 2B rows, the B chosen answers then the B rejected
// ones (collate_preference); r_c, r_r are each row's score at its last real token and m the
// pair's margin (0 without a `margin` column):
//   loss = sum over pairs of  -log sigmoid(r_c - r_r - m) + c (r_c + r_r)^2,   times `scale`
// with c = center_rewards_coefficient (TRL adds c * mean((r_c + r_r)^2) to the mean loss, which
// is this with scale = 1 / pairs). The step's scale is 1 / the pairs of the optimizer step.
#include <cstdint>

#include "fusetune/graph/builder.h"

namespace fusetune {

struct RewardLoss {
  double center_rewards_coefficient = 0.0;
};

// Each row's score at its last real token: `scores` [rows*T, L] (every position) times the
// one-hot `last_token_mask` [rows*T] (1 at each row's last real token), summed per row:
// [rows, L]. The product by 1 and the sum of zeros are exact, so the result is bitwise the
// score at that position (transformers' pooled_logits).
Value build_last_token_scores(Builder& b, Value scores, Value last_token_mask, int64_t rows);

struct RewardLossOutputs {
  Value loss;              // []
  Value chosen_rewards;    // [B]
  Value rejected_rewards;  // [B]
};

// `rewards` [2B]: chosen then rejected; `margins` [B] or invalid (none).
RewardLossOutputs build_reward_loss(Builder& b, const RewardLoss& loss, Value rewards,
                                    Value margins, Value scale);

}  // namespace fusetune
