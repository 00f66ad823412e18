#pragma once
// Generic elementwise fusion: a tree of Add / Mul / Scale / Silu / SiluBackward nodes (same-size
// operands, or a suffix-broadcast second operand of Add/Mul) whose intermediate values have no
// other reader becomes one Elementwise node running a small program per block of elements
// (kernels/cpu/elementwise_program.h): each input byte is read once and only the root's result
// is written. Intermediates may pass through a Reshape (a view: the flat layout is the same).
// Fill nodes feeding the tree become constants. Typical trees: the LoRA sum y + s * (x A^T B^T),
// gradient sums (a + b) + c, silu'(gate) * (dy * up), bias adds after another elementwise op.
#include "fusetune/compile/pass.h"

namespace fusetune::passes::fuse_elementwise {
std::string run(Graph& g, const PassOptions& opts);
}
