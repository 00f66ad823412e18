#pragma once
// Fused LM head + cross-entropy (DESIGN.md §3): loss and both gradients in one pass over the
// tokens, in chunks of `chunk_rows`, so only a [chunk_rows, V] scratch of logits ever exists.
//   z = h_c W^T;  loss += logsumexp(z) - z[label];  dz = (softmax(z) - onehot(label)) * scale
//   dh_c = dz W;  dW += dz^T h_c
// Rows whose label is -100 are skipped entirely (their dh is zero). Returns scale * sum of
// the per-token losses. h [N, D], W [V, D], dh [N, D], dW [V, D].
#include <cstdint>

namespace fusetune::kernels {

template <class T>
double fused_linear_cross_entropy(const T* h, const T* W, const int32_t* labels, T scale, int64_t N,
                                  int64_t D, int64_t V, int64_t chunk_rows, T* dh, T* dW);

// Chunk size that keeps the [chunk, V] scratch within `budget_bytes` (at least 16 rows).
int64_t fused_ce_chunk_rows(int64_t N, int64_t V, int64_t elem_bytes, int64_t budget_bytes);

}  // namespace fusetune::kernels
