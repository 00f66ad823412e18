#pragma once
// The student's LM head handed to the fused distillation kernel as its parts instead of as
// logits (docs/design.md §3, losses/distillation.h: KdStudentHead): the float base weight or
// an NF4 head's three parts, and LoRA's A and scale * B when lm_head has an adapter (with
// lora_dropout, the adapter's dropped-out input; with DoRA, its column scale
// magnitude / ||W + s B A||_row). The kernel then forms (h W^T + s (x A^T) B^T) diag(c) a chunk
// of tokens at a time.
#include <functional>
#include <memory>

#include "fusetune/losses/distillation.h"
#include "fusetune/models/llama.h"
#include "fusetune/peft/lora.h"

namespace fusetune::peft {

// A head hook (LlamaOptions::head) that creates the head's leaves as lora_llama_options'
// would (the same parameter names), records them in `out` and computes no logits (returns an
// invalid Value). `nf4` is read when the graph is built (the store may be filled later).
// Defined in peft/lora.cpp.
LinearFn head_parts_hook(const LoraConfig& c, std::function<const NF4Store*()> nf4,
                         std::shared_ptr<KdStudentHead> out);

}  // namespace fusetune::peft
