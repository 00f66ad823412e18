#pragma once
// The generate recipe (torchtune's `generate`): a prompt in, the model's answer streamed to
// stdout, prefill and decode speeds to stderr (generation/generator.h does the work).
#include "fusetune/config/config.h"

namespace fusetune {

int generate_recipe(const Config& cfg);

}  // namespace fusetune
