#pragma once
// The heart of `compile: true` (docs/design.md §3): finds
//   logits = h W^T -> log_softmax -> nll -> * scale        and its backward
//   NllBackward -> LogSoftmaxBackward -> (dlogits W, dlogits^T h)
// and replaces all of it by one FusedLinearCrossEntropy node that yields the loss, dh and dW
// chunk by chunk. The [tokens, vocab] logits, log-probs and their gradients never exist.
// A frozen head (no dW reader) gets no dW output; a frozen NF4 head (QLoRA: NF4MatMul and
// NF4MatMulBackward) becomes FusedNF4LinearCrossEntropy, which dequantizes W tile by tile; a
// fake-quantized head (QAT: FakeQuantMatMul and FakeQuantMatMulBackward) becomes a
// FusedLinearCrossEntropy with a fifth input, FakeQuantMatMul's [] I32 enable, and its
// attrs.groups (the kernels::FakeQuant scheme) and attrs.len (the group): while enable is set,
// the kernel fake-quantizes W tile by tile and dW is the gradient w.r.t. fq(W).
// Needs the loss region, so it does nothing under `compile: model`.
#include "fusetune/compile/pass.h"

namespace fusetune::passes::fuse_linear_cross_entropy {
std::string run(Graph& g, const PassOptions& opts);
}
