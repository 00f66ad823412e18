#pragma once
// RMSNorm fused with the residual add around it (the Llama block's h = h + f(rmsnorm(h))):
// the forward reads the two addends once and writes the sum and its norm; the backward adds
// the incoming residual gradient to dx in the same pass. Rows of length D; the mean of squares
// and the row dot products accumulate in double, as in rmsnorm_forward / rmsnorm_backward
// (kernels.h), whose numbers these reproduce: all of them are defined in norm.cpp and share
// its row helpers.
#include <cstdint>

namespace fusetune::kernels {

// s = h + x; y = s / sqrt(mean(s^2) + eps) * w. s may be the buffer of h or x (in place).
template <class T>
void add_rmsnorm_forward(const T* h, const T* x, const T* w, T* s, T* y, int64_t rows, int64_t D,
                         double eps);

// dx = rmsnorm_backward(x, w, dy).dx + dres (dx may alias dres: each element is read before
// it is written); dw = sum over rows (when dw != nullptr; overwritten, deterministic: fixed
// row chunks combined in order, independent of the thread count).
template <class T>
void rmsnorm_backward_add(const T* x, const T* w, const T* dy, const T* dres, T* dx, T* dw,
                          int64_t rows, int64_t D, double eps);

}  // namespace fusetune::kernels
