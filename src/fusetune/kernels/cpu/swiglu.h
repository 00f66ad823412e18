#pragma once
// SwiGLU, the Llama MLP's gate: out = silu(g) * u, and its backward, each one pass over memory.
// The backward recomputes silu(g) from g instead of reading a saved silu(g), so a compiled step
// does not keep silu(g) alive between the forward and the backward. The arithmetic is that of
// the unfused silu / silu_backward / mul kernels (elementwise.cpp), operation for operation.
// Each element is read before it is written, so an output may be the same buffer as an input
// (in-place memory planning).
#include <cstdint>

namespace fusetune::kernels {

// out[i] = silu(g[i]) * u[i], silu(x) = x / (1 + e^-x).
template <class T>
void swiglu(const T* g, const T* u, T* out, int64_t n);

// With s = sigmoid(g): dg = (dy * u) * s * (1 + g * (1 - s)), du = dy * silu(g).
template <class T>
void swiglu_backward(const T* g, const T* u, const T* dy, T* dg, T* du, int64_t n);

}  // namespace fusetune::kernels
