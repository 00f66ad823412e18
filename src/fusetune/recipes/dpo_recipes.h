#pragma once
#include "fusetune/config/config.h"

namespace fusetune {

// lora_dpo_single_device: preference optimization of LoRA adapters; the reference model is
// the same base with the adapters disabled (torchtune's disable_adapter).
int lora_dpo_single_device(const Config& cfg);

// full_dpo_single_device: preference optimization of every weight; the reference model is a
// frozen copy loaded from ref_checkpointer (torchtune has only the distributed recipe).
int full_dpo_single_device(const Config& cfg);

}  // namespace fusetune
