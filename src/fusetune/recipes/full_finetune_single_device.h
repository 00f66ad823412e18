#pragma once
#include "fusetune/config/config.h"

namespace fusetune {

// The full_finetune_single_device recipe; see recipes/registry.h for what the config holds.
int full_finetune_single_device(const Config& cfg);

}  // namespace fusetune
