#pragma once
// reward_model_finetune_single_device (docs/design.md §12): a sequence classifier trained on
// preference pairs with TRL RewardTrainer's loss, written as a Hugging Face
// *ForSequenceClassification checkpoint (what PPO loads as its reward and value models).
#include <string>

#include "fusetune/config/config.h"
#include "fusetune/recipes/train_loop.h"

namespace fusetune {

int reward_model_finetune_single_device(const Config& cfg);

// Its job, named `recipe`: every weight trains; a causal LM checkpoint becomes a classifier of
// one score (a fresh `score`, as transformers' AutoModelForSequenceClassification with
// num_labels=1 loads it).
TrainJob reward_model_job(const Config& cfg, const std::string& recipe);

// lora_reward_model_finetune_single_device: the same loss with LoRA adapters on the trunk and
// the `score` head trained in full (TRL's RewardTrainer with a PEFT config, task SEQ_CLS). A
// checkpoint holds the merged classifier (an HF *ForSequenceClassification, what PPO and the
// `reward_model` reward load) unless save_adapter_weights_only, and the PEFT adapter with
// `score` in modules_to_save (what resuming reads).
int lora_reward_model_finetune_single_device(const Config& cfg);
TrainJob lora_reward_model_job(const Config& cfg, const std::string& recipe);

}  // namespace fusetune
