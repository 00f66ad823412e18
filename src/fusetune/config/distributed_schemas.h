#pragma once
// The config schemas of the data-parallel recipes: the single-device recipe's keys plus the
// distributed ones (zero_stage, dist_timeout_seconds) and torchtune's FSDP keys, accepted
// where they mean something here and explained where they do not.
#include "fusetune/config/schema.h"

namespace fusetune {

const Schema& full_finetune_distributed_schema();
const Schema& lora_finetune_distributed_schema();
const Schema& qat_distributed_schema();
const Schema& qat_lora_finetune_distributed_schema();
const Schema& lora_dpo_distributed_schema();
const Schema& full_dpo_distributed_schema();
// GRPO over ranks: ZeRO 0-2 (the rollout generates on whole parameters).
const Schema& grpo_full_distributed_schema();
const Schema& lora_grpo_distributed_schema();
// PPO over ranks: ZeRO 0-2 (the rollout generates on whole parameters), no optimizer_in_bwd
// (each PPO update's gradients are summed over the ranks before the optimizer sees them).
const Schema& ppo_full_distributed_schema();
const Schema& reward_model_distributed_schema();
const Schema& knowledge_distillation_distributed_schema();

}  // namespace fusetune
