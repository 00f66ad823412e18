#pragma once
// Training FLOPs per token, the numerator of model FLOP utilization (docs/design.md §7). Counted
// per matmul: 2*in*out forward, 2*in*out for the input gradient, 2*in*out more for the
// weight gradient only when that weight is trainable; attention scores and context
// (2 * 2 * T * head_dim per head, forward) times 3 for forward + backward.
#include <cstdint>

#include "fusetune/models/llama.h"

namespace fusetune {

double training_flops_per_token(const ModelConfig& c, int64_t seq_len,
                                const TrainablePredicate& trainable);

}  // namespace fusetune
