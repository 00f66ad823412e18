#pragma once
// SwiGLU fusion for the Llama MLP, down(silu(gate(x)) * up(x)). Finds
//   s = Silu(g); p = Mul(s, u)                                     (either operand order)
// and its backward exactly as autodiff emits it,
//   ds = Mul(dp, u); dg = SiluBackward(g, ds); du = Mul(dp, s)
// and replaces them by p = SwiGLU(g, u) and (dg, du) = SwiGLUBackward(g, u, dp), which
// recomputes silu(g) instead of reading it. Backward readers of p (down_proj's weight gradient,
// a LoRA A gradient) read a second SwiGLU(g, u) emitted just before them, so neither silu(g)
// nor p stays alive from the forward to the backward: g and u, which the backward needs anyway,
// are the only saved activations of the gate. A graph where s has other readers, or whose
// backward has another shape, is left as it is.
#include "fusetune/compile/pass.h"

namespace fusetune::passes::fuse_swiglu {
std::string run(Graph& g, const PassOptions& opts);
}
