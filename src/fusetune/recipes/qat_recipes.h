#pragma once
// qat_single_device and qat_lora_finetune_single_device: full and LoRA fine-tuning with the
// model's linear layers fake-quantized (quant/qat.h), as torchtune's QAT recipes.
#include "fusetune/config/config.h"

namespace fusetune {

int qat_single_device(const Config& cfg);
int qat_lora_finetune_single_device(const Config& cfg);

}  // namespace fusetune
