#pragma once
#include <functional>
#include <memory>

#include "fusetune/config/config.h"
#include "fusetune/losses/distillation.h"
#include "fusetune/peft/lora.h"
#include "fusetune/recipes/train_loop.h"

namespace fusetune {

// The lora_finetune_single_device recipe; see recipes/registry.h for what the config holds.
int lora_finetune_single_device(const Config& cfg);

// The config's LoRA settings (model.lora_*, apply_lora_to_*, use_dora, quantize_base),
// validated. `fusetune plan` builds the same step graph from them.
peft::LoraConfig lora_config_from(const Config& cfg);

// The LoRA recipe's job (adapters, NF4 base, dropout seeds, PEFT checkpoints) for recipes
// built on it, and the hooks of the frozen base without its adapters (lora_dpo's reference).
struct LoraJob {
  TrainJob job;
  LlamaOptions base;
  // The head as parts for the fused distillation kernel (peft/head_parts.h: a head hook that
  // records them into its argument), and for validation (no lora_dropout; empty: the same).
  std::function<LinearFn(std::shared_ptr<KdStudentHead>)> head_parts, eval_head_parts;
};
LoraJob lora_training_job(const Config& cfg, const std::string& recipe);

}  // namespace fusetune
