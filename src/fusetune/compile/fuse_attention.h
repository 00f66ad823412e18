#pragma once
// Attention fusion (docs/design.md §3). Finds the eager attention of models/llama.cpp
//   q [B,T,H,hd], k, v [B,T,KV,hd] -> Transpose(1,2) (+ RepeatHeads for k, v)
//   -> MatMul(q, k^T) -> Scale -> CausalMask [-> doc_ids] -> Softmax -> MatMul(p, v)
//   -> Transpose(1,2)
// and the nodes autodiff emitted for it (Transpose, MatMul with transpose flags,
// SoftmaxBackward, CausalMaskBackward, Scale, RepeatHeadsBackward, Transpose), and replaces
// them by FlashAttention (q, k, v [, doc_ids]) -> (o, lse) and FlashAttentionBackward
// (q, k, v, o, lse, do [, doc_ids]) -> (dq, dk, dv). The [B, H, T, T] scores, probabilities
// and their gradients, and the transposed / repeated copies of q, k, v, never exist.
// A site is rewritten only when it matches exactly (every intermediate read only by the
// pattern); a forward-only graph gets the forward op alone. Nodes of a region above
// opts.max_region() are left alone.
#include "fusetune/compile/pass.h"

namespace fusetune::passes::fuse_attention {
std::string run(Graph& g, const PassOptions& opts);
}
