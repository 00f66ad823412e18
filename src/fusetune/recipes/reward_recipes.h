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

}  // namespace fusetune
