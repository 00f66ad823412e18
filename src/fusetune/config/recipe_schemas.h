#pragma once
// The config schemas of the built-in recipes. Keys keep torchtune's names; see the .cpp for
// every key with its type, default and one-line help (`fusetune validate` reports against
// these). A later recipe starts from a copy and adds keys:
//   Schema s = full_finetune_schema(); s.recipe = "..."; s.add(Field::Bool("x").def("false"));
#include "fusetune/config/schema.h"

namespace fusetune {

// full_finetune_single_device: every parameter trained.
const Schema& full_finetune_schema();
// lora_finetune_single_device: the full schema plus model.lora_attn_modules,
// model.apply_lora_to_mlp, model.apply_lora_to_output, model.lora_rank, model.lora_alpha,
// model.lora_dropout, model.use_dora, model.quantize_base (torchtune keeps these under
// `model`), checkpointer.adapter_checkpoint and save_adapter_weights_only.
const Schema& lora_finetune_schema();
const Schema& lora_dpo_schema();  // lora_finetune's keys + precompute_ref_log_probs
const Schema&
full_dpo_schema();  // full_finetune's keys + ref_checkpointer, precompute_ref_log_probs

// knowledge_distillation_single_device: lora_finetune's keys (lora_attn_modules optional: a
// full student without it) + teacher_model, teacher_checkpointer, kd_loss, kd_ratio.
const Schema& knowledge_distillation_schema();

// grpo_full_finetune_single_device / lora_grpo_finetune_single_device: full / lora's keys (+
// ref_checkpointer for full) and the rollout's: grpo_samples, max_generated_tokens,
// temperature, top_k, num_iterations (ppo_epochs), forward_batch_size, scale_rewards, rewards,
// num_steps, save_every_n_epochs.
const Schema& grpo_full_schema();
const Schema& lora_grpo_schema();

// qat_single_device / qat_lora_finetune_single_device (quant/qat.h): full / lora's keys plus the
// `quantizer` section and fake_quant_after_n_steps.
const Schema& qat_schema();
const Schema& qat_lora_schema();

// reward_model_finetune_single_device: full_finetune's keys on preference pairs (dataset kind
// preference, no loss section) plus center_rewards_coefficient.
const Schema& reward_model_schema();
// lora_reward_model_finetune_single_device: the LoRA recipe's keys with the reward loss's.
const Schema& lora_reward_model_schema();

// ppo_full_finetune_single_device: full_finetune's keys without `model` and validation, plus
// policy_model, reward_and_value_model, the ref_policy / value / reward checkpointers and the
// rollout's and PPO's keys (torchtune's names).
const Schema& ppo_schema();

// The `model` map every recipe shares (architecture keys, init, the torchtune builder);
// lora_recipe: LoRA builder names (lora_*, qlora_*) are accepted.
Field model_field(bool lora_recipe);

}  // namespace fusetune
