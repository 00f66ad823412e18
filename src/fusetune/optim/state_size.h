#pragma once
// How many bytes of optimizer state a trainable parameter will hold, asked before any optimizer
// exists (compile/memory_estimate.h predicts a step's memory from it). The optimizers answer
// here, so the estimate needs to know no optimizer's state layout.
#include <cstdint>

namespace fusetune {

// `per_param_byte` bytes per byte of parameter (AdamW: 2, SGD with momentum: 1, plain SGD: 0),
// or, with min_8bit_numel > 0 (8-bit AdamW, adamw8bit.h), parameters of at least that many
// elements hold the 8-bit state instead (two byte codes per element, two fp32 absmax per
// 2048-element block: AdamW8bit::state_bytes_for).
struct OptimizerStateSize {
  double per_param_byte = 0;
  int64_t min_8bit_numel = 0;
  OptimizerStateSize(double ratio = 0) : per_param_byte(ratio) {}  // NOLINT: from a ratio
  int64_t bytes(int64_t numel, int64_t nbytes) const;
};

}  // namespace fusetune
