#pragma once
// How a recipe hands trainable parameters to the optimizer and to gradient clipping: a name
// (the key of its optimizer state, e.g. "layers.0.attn.q_proj.lora_a.weight") and pointers to
// the live value and gradient. Frozen parameters are simply not passed.
#include <string>
#include <vector>

#include "fusetune/core/tensor.h"

namespace fusetune {

struct ParamRef {
  std::string name;
  Tensor* value = nullptr;
  Tensor* grad = nullptr;  // null or undefined: no gradient this step (skipped, as torch does)
};

// True when the parameter has a gradient to apply.
inline bool has_grad(const ParamRef& p) { return p.grad != nullptr && p.grad->defined(); }

// Checks what every optimizer step and clip needs: unique names, a defined F32/F64/BF16 value,
// and (when present) a gradient of the same dtype and shape (BF16 values: BF16 gradients). Throws
// fusetune::Error naming the parameter at fault. `who` prefixes the message ("AdamW",
// "clip_grad_norm").
void check_params(const std::vector<ParamRef>& params, const char* who);

}  // namespace fusetune
