#pragma once
// Cross-entropy over shifted labels (-100 = ignore), written the way PyTorch eager runs it:
// logits = h W^T (materialized, fp32), log_softmax, nll (sum), times `scale`. The LM-head
// matmul belongs to the model region; log_softmax, nll and the scaling form the loss region,
// which `compile: model` leaves eager and `compile: true` fuses with the matmul.
#include "fusetune/graph/builder.h"

namespace fusetune {

// hidden [N, D], head [V, D], labels [N] I32, scale [] (1 / number of valid labels across all
// micro-batches of the optimizer step). Returns the scalar loss.
Value build_cross_entropy(Builder& b, Value hidden, Value head, Value labels, Value scale);

// The same loss from logits [N, V] the model computed itself (a head with a LoRA adapter);
// the fused linear + cross-entropy pass does not apply to it.
Value build_cross_entropy_from_logits(Builder& b, Value logits, Value labels, Value scale);

}  // namespace fusetune
