#pragma once
// ppo_full_finetune_single_device (torchtune's recipe; docs/ppo.md, docs/design.md §11): the
// shared training loop (train_loop.h) with batches of prompts and the PPO step (ppo_step.h).
// Four models: the policy (policy_model + checkpointer, trained), its frozen reference
// (ref_policy_checkpointer), the value model (value_checkpointer, trained: its parameters sit
// beside the policy's as value_model.<name>, under the one optimizer) and the frozen reward
// model (reward_checkpointer). The value and reward models are classifiers of one score.
//
// A loop step is torchtune's: one trajectory of batch_size prompts and its ppo_epochs x
// (batch_size / ppo_batch_size) updates; num_steps counts prompts (num_steps // batch_size
// steps). A checkpoint holds the policy (the HF files), the value model (its `value/`
// subdirectory, an HF *ForSequenceClassification), the optimizer of both and the progress.
#include <string>

#include "fusetune/config/config.h"
#include "fusetune/recipes/train_loop.h"

namespace fusetune {

int ppo_full_finetune_single_device(const Config& cfg);

// `world`: the number of data-parallel ranks (ppo_full_finetune_distributed); num_steps counts
// the prompts of all of them, batch_size x world a step.
TrainJob ppo_job(const Config& cfg, const std::string& recipe, int world = 1);

// The prefix of the value model's parameters among the trained ones.
inline const std::string kPpoValuePrefix = "value_model.";

}  // namespace fusetune
