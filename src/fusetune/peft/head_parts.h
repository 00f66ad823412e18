#pragma once
// The student's LM head handed to the fused distillation kernel as its parts instead of as
// logits (docs/design.md §3, losses/distillation.h: KdStudentHead): the float base weight or
// an NF4 head's three parts, and LoRA's A and scale * B when lm_head has an adapter. The
// kernel then forms h W^T + s (h A^T) B^T a chunk of tokens at a time.
#include <functional>
#include <memory>

#include "fusetune/losses/distillation.h"
#include "fusetune/models/llama.h"
#include "fusetune/peft/lora.h"

namespace fusetune::peft {

// Whether a head under `c` can be handed as parts: not with DoRA or dropout on an adapted
// lm_head (the kernel has neither the magnitude's row norm nor the dropped-out input).
bool head_parts_supported(const LoraConfig& c);

// A head hook (LlamaOptions::head) that creates the head's leaves as lora_llama_options'
// would (the same parameter names), records them in `out` and computes no logits (returns an
// invalid Value). `nf4` is read when the graph is built (the store may be filled later).
// Defined in peft/lora.cpp.
LinearFn head_parts_hook(const LoraConfig& c, std::function<const NF4Store*()> nf4,
                         std::shared_ptr<KdStudentHead> out);

}  // namespace fusetune::peft
