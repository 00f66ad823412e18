#pragma once
// qat_single_device and qat_lora_finetune_single_device: full and LoRA fine-tuning with the
// model's linear layers fake-quantized (quant/qat.h), as torchtune's QAT recipes.
#include <string>

#include "fusetune/config/config.h"
#include "fusetune/recipes/train_loop.h"

namespace fusetune {

int qat_single_device(const Config& cfg);
int qat_lora_finetune_single_device(const Config& cfg);

// Their jobs (full / LoRA with fake quantization), which qat_distributed and
// qat_lora_finetune_distributed run as data-parallel ranks. `recipe` names the run.
TrainJob qat_training_job(const Config& cfg, const std::string& recipe);
TrainJob qat_lora_training_job(const Config& cfg, const std::string& recipe);

}  // namespace fusetune
