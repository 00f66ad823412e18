#pragma once
#include "fusetune/config/config.h"

namespace fusetune {

// The lora_finetune_single_device recipe; see recipes/registry.h for what the config holds.
int lora_finetune_single_device(const Config& cfg);

}  // namespace fusetune
