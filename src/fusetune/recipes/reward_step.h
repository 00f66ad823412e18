#pragma once
// The reward model's step (reward_model_finetune_single_device, docs/design.md §12). A batch
// holds B pairs as 2B rows, chosen then rejected (collate_preference). Per micro-batch one joint
// graph: the classifier's forward, each row's score at its last real token, TRL
// RewardTrainer's loss (losses/reward.h) and the backward. Metrics, as TRL logs them: accuracy
// (the share of pairs with r_c > r_r), rewards/chosen and rewards/rejected (mean scores) and
// rewards/margins (mean r_c - r_r), each as a sum and a count of pairs.
#include <memory>

#include "fusetune/losses/reward.h"
#include "fusetune/recipes/sft_step.h"

namespace fusetune {

struct RewardStepOptions {
  ModelStepOptions model;  // the classifier (its params, hooks, passes)
  RewardLoss loss;
};

std::unique_ptr<TrainingStep> make_reward_step(RewardStepOptions opts);

// "last_token_mask" [rows*T]: 1 at each row's last real token (Batch::lengths), else 0. A row
// without a token is an error.
Tensor last_token_mask(const Batch& b);

}  // namespace fusetune
