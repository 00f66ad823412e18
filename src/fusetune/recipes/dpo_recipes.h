#pragma once
#include <string>

#include "fusetune/config/config.h"
#include "fusetune/recipes/train_loop.h"

namespace fusetune {

// lora_dpo_single_device: preference optimization of LoRA adapters; the reference model is
// the same base with the adapters disabled (torchtune's disable_adapter).
int lora_dpo_single_device(const Config& cfg);

// full_dpo_single_device: preference optimization of every weight; the reference model is a
// frozen copy loaded from ref_checkpointer (torchtune has only the distributed recipe).
int full_dpo_single_device(const Config& cfg);

// Their jobs, named `recipe` (the *_distributed recipes run them as ranks).
TrainJob lora_dpo_job(const Config& cfg, const std::string& recipe);
TrainJob full_dpo_job(const std::string& recipe);

// The frozen reference of full DPO and full GRPO: ref_checkpointer's checkpoint, which must
// be the policy's architecture, in the policy's dtype.
TensorMap load_reference(const Config& cfg, const LoadedModel& policy, const std::string& recipe,
                         const std::string& section = "ref_checkpointer");

}  // namespace fusetune
