#pragma once
// RMSNorm fused with the residual add that precedes it (forward) and the residual-gradient add
// that follows it (backward), for the Llama block h = h + f(rmsnorm(h)):
//   forward   s = Add(h, x); y = RMSNorm(s, w)       -> (s, y) = AddRMSNorm(h, x, w)
//   backward  (dx, dw) = RMSNormBackward(s, w, dy); Add(dres, dx) (either order)
//                                                    -> (dx + dres, dw) = RMSNormBackwardAdd(s, w,
//                                                    dy, dres)
// Each fused kernel makes one pass over the rows instead of two. The two rewrites are
// independent (the first layer's input norm has no Add before it but its backward still fuses).
// Under activation checkpointing an Add and RMSNorm of different layers are not fused, so each
// layer's saved input stays one tensor.
#include "fusetune/compile/pass.h"

namespace fusetune::passes::fuse_rmsnorm_residual {
std::string run(Graph& g, const PassOptions& opts);
}
