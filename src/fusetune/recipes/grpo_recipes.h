#pragma once
// The GRPO recipes (docs/design.md §11): the shared training loop (train_loop.h) with prompts
// as data (dataset kind gsm8k) and the GRPO step (grpo_step.h). Full and LoRA GRPO differ in
// what trains and where the reference comes from (beta != 0 only): a frozen copy from
// ref_checkpointer, or the same base weights with the adapters off.
#include <string>
#include <vector>

#include "fusetune/config/config.h"
#include "fusetune/config/schema.h"
#include "fusetune/losses/grpo.h"
#include "fusetune/recipes/train_loop.h"
#include "fusetune/tokenizers/tokenizer.h"

namespace fusetune {

int grpo_full_finetune_single_device(const Config& cfg);
int lora_grpo_finetune_single_device(const Config& cfg);

// Their jobs, named `recipe`.
TrainJob full_grpo_job(const std::string& recipe);
TrainJob lora_grpo_job(const Config& cfg, const std::string& recipe);

// The loss the config names: GRPOSimpleLoss (torchtune: kl_coeff, epsilon) or GRPOLoss (TRL's
// keys: loss_type, beta, epsilon, epsilon_high); its temperature is the sampling temperature.
GrpoLoss grpo_loss_from(const Config& cfg);

// The stop tokens of a rollout (GRPO, PPO without stop_token_ids): the tokenizer's EOS and the
// model's, sorted, once each.
std::vector<int32_t> stop_tokens_of(const Tokenizer& tok, const ModelConfig& model);

// `schema` (a GRPO recipe's) plus a check of the `rewards` map's kinds and keys, which
// rewards/ knows, a layer above config/: `fusetune validate` then names a bad reward key
// instead of the run stopping at its start. A `reward_model` reward's checkpoint is not
// opened.
Schema with_rewards_check(const Schema& schema);

}  // namespace fusetune
