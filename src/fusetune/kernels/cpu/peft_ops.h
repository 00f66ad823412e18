#pragma once
// Small kernels for PEFT adapters (graph ops Dropout and RowInvNorm). Raw pointers, like
// kernels.h; instantiated for float and double.
#include <cstdint>

namespace fusetune::kernels {

// out[i] = keep(i) ? x[i] / (1 - p) : 0, keep(i) = hash(seed, salt, i) >= p as a uniform in
// [0, 1). The mask depends only on (seed, salt, i): the same call on dy is the VJP, and runs
// are reproducible whatever the thread count. p = 0 copies x.
template <class T>
void dropout(const T* x, T* out, int64_t n, double p, uint64_t seed, uint64_t salt);

// out[o] = 1 / ||w[o, :]||_2 for a row-major [rows, cols] matrix (DoRA's weight norm, inverted
// so the magnitude scale is one Mul). A zero row gives 1 / 1e-30 rather than inf.
template <class T>
void row_inv_norm(const T* w, T* out, int64_t rows, int64_t cols);

// The same for the merged weight w + bs a (w [rows, cols], bs [rows, r], a [r, cols]: DoRA's
// W + s B A with bs = s B) without forming it: a tile of merged rows at a time.
template <class T>
void row_inv_norm_low_rank(const T* w, const T* a, const T* bs, T* out, int64_t rows, int64_t cols,
                           int64_t r);

}  // namespace fusetune::kernels
