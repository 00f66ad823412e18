#pragma once
// Fused LM head + log_softmax + label gather (DESIGN.md §7), for the preference losses: per
// token, the log-probability of its label, without a [N, V] tensor. Tokens are processed in
// chunks of `chunk_rows`, so only a [chunk_rows, V] block of logits ever exists.
//   forward:  z = h_c W^T;  lse = logsumexp(z);  logp = z[y] - lse;  zsum = sum_j z_j
//   backward: z recomputed;  dz = dlogp * (onehot(y) - exp(z - lse));  dh_c = dz W;  dW += dz^T h_c
// Rows whose label is -100 are skipped: logp = lse = zsum = 0 and dh = 0 there.
// h [N, D], W [V, D]; an NF4 head (QLoRA) is dequantized tile by tile inside the GEMMs.
#include <cstdint>

#include "fusetune/kernels/cpu/nf4.h"

namespace fusetune::kernels {

// The head: exactly one of `W` (dense [V, D]) and `nf4` is set.
template <class T>
struct LogProbHead {
  const T* W = nullptr;
  const NF4View* nf4 = nullptr;
  int64_t V = 0, D = 0;
};

template <class T>
void fused_linear_log_probs(const T* h, const int32_t* labels, const LogProbHead<T>& head,
                            int64_t N, int64_t chunk_rows, T* logp, T* lse, T* zsum);

// dW == nullptr: no weight gradient (a frozen or NF4 head).
template <class T>
void fused_linear_log_probs_backward(const T* h, const int32_t* labels, const T* lse,
                                     const T* dlogp, const LogProbHead<T>& head, int64_t N,
                                     int64_t chunk_rows, T* dh, T* dW);

// Bytes of counted scratch the kernels allocate: the [C, V] logits block and the gathered
// rows [C, D] (backward: and their gradient), plus the NF4 tile.
int64_t fused_log_probs_scratch_bytes(int64_t chunk_rows, int64_t D, int64_t V, int64_t elem_bytes,
                                      bool nf4, bool backward);

}  // namespace fusetune::kernels
