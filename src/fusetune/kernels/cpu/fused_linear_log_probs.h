#pragma once
// Fused LM head + log_softmax + label gather (docs/design.md §3), for the preference losses: per
// token, the log-probability of its label, without a [N, V] tensor. Tokens are processed in
// chunks of `chunk_rows`, so only a [chunk_rows, V] block of logits ever exists.
//   forward:  z = h_c W^T;  lse = logsumexp(z);  logp = z[y] - lse;  zsum = sum_j z_j
//   backward: z recomputed;  dz = dlogp * (onehot(y) - exp(z - lse));  dh_c = dz W;  dW += dz^T h_c
// Rows whose label is -100 are skipped: logp = lse = zsum = 0 and dh = 0 there. A frozen head
// (LoRA, QLoRA) takes a cheaper route: the forward also keeps E_p[W] per row, and the backward
// needs no GEMM (fused_linear_log_probs_backward_frozen).
// h [N, D], W [V, D]; an NF4 head (QLoRA) is dequantized tile by tile inside the GEMMs.
#include <cstdint>

#include "fusetune/kernels/cpu/bf16_head_products.h"

#include "fusetune/kernels/cpu/nf4.h"

namespace fusetune::kernels {

// The head: exactly one of `W` (dense [V, D]), `nf4` and `bf16` is set.
template <class T>
struct LogProbHead {
  const T* W = nullptr;
  const NF4View* nf4 = nullptr;
  int64_t V = 0, D = 0;
  // A bf16 W (dtype: bf16), widened tile by tile like NF4. A bf16 or NF4 head runs on the CPU's
  // bf16 dot products where h holds bf16 values (fused_linear_cross_entropy.h's rule).
  const uint16_t* bf16 = nullptr;
  // > 0: the logits are soft-capped, z := softcap * tanh(z / softcap) (Gemma 2), before all of
  // the above; the gradients go back through the cap (the frozen route's E_p[W] then carries
  // the cap's slope: see fused_linear_log_probs.cpp).
  double softcap = 0.0;
};

// expect != nullptr (a frozen head whose backward will only need dh): also
// expect[r, :] = sum_v softmax(z_r)_v W[v, :] = E_p[W] [N, D] (0 at ignored rows), one more
// GEMM per chunk here that spares the backward its recomputation of the logits.
// logits != nullptr (a dense, uncapped head whose N rows fit one chunk, N <= chunk_rows): the
// chunk's logits are formed there ([N, V]: the labelled rows first, in order; the rest is
// unspecified) instead of in scratch, for the backward to take instead of recomputing them.
template <class T>
void fused_linear_log_probs(const T* h, const int32_t* labels, const LogProbHead<T>& head,
                            int64_t N, int64_t chunk_rows, T* logp, T* lse, T* zsum,
                            T* expect = nullptr, T* logits = nullptr);

// The general backward (the head trains: recompute each chunk's logits, then dh and dW).
// dW == nullptr: no weight gradient. logits != nullptr: the forward's (see above), taken
// instead of recomputed (one GEMM less) and overwritten with dz; bitwise the same results.
template <class T>
void fused_linear_log_probs_backward(const T* h, const int32_t* labels, const T* lse,
                                     const T* dlogp, const LogProbHead<T>& head, int64_t N,
                                     int64_t chunk_rows, T* dh, T* dW, T* logits = nullptr);

// The backward of a frozen head from the forward's E_p[W]: no logits at all, since
//   dh_r = dlogp_r (W[y_r] - E_p[W]_r)     (dz W with dz = dlogp (onehot(y) - softmax(z)))
template <class T>
void fused_linear_log_probs_backward_frozen(const int32_t* labels, const T* expect, const T* dlogp,
                                            const LogProbHead<T>& head, int64_t N, T* dh);

// Bytes of counted scratch the kernels allocate: the [C, V] logits block (not with
// `kept_logits`: the forward's logits are a tensor of the graph) and the gathered rows [C, D]
// (trainable backward: and their gradient; frozen forward: their E_p[W]), plus the NF4 or bf16
// tile, or on bf16 dot products (bf16) the larger of that tile and what they take there
// (bf16_head_products.h); the frozen backward only one dequantized NF4 row.
int64_t fused_log_probs_scratch_bytes(int64_t chunk_rows, int64_t D, int64_t V, int64_t elem_bytes,
                                      bool tiled, bool backward, bool frozen,
                                      Bf16HeadProducts bf16 = Bf16HeadProducts::None,
                                      bool kept_logits = false);

}  // namespace fusetune::kernels
