#pragma once
// Copy elimination: Transposes that only feed code able to read the data as it is.
//  - MatMul(Transpose(x, -2, -1), ...) reads x with the operand's transpose flag flipped;
//  - Transpose(MatMul(a, b), -2, -1) (MatMul read by it alone) is MatMul(b, a), flags swapped;
//  - Transpose(Transpose(x, d0, d1), d0, d1) and Transpose(x, d, d) are x.
// A Transpose left without readers is dropped. Reshape is already a view (no copy).
#include "fusetune/compile/pass.h"

namespace fusetune::passes::eliminate_copies {
std::string run(Graph& g, const PassOptions& opts);
}
