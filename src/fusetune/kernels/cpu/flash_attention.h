#pragma once
// Causal attention without the [T, T] scores (docs/design.md §3): queries and keys are
// processed in tiles with an online softmax (FlashAttention-2, Dao 2023), so at most one
// [kBlockQ, kBlockK] tile of scores per thread exists. GQA reads the shared K/V head in place
// (query head h uses kv head h / (H / KV)); nothing is transposed or repeated.
//
// Layouts, row-major: q, o, do, dq [B, T, H, hd]; k, v, dk, dv [B, T, KV, hd]; lse [B, H, T];
// doc_ids [B, T] or null. Query i attends to key j iff j <= i and (no doc_ids, or doc_ids[b, j]
// == doc_ids[b, i]) and (no window, or i - j < window), exactly as causal_mask() masks the eager
// scores. A softcap c > 0 caps the scaled scores s to c tanh(s / c) before the mask (Gemma 2).
//   forward:  o = softmax(cap(scale q k^T) + mask) v, lse[b,h,i] = logsumexp of that row
//   backward: dq, dk, dv from q, k, v, o, lse, do (probabilities recomputed tile by tile;
//             dk, dv summed over the query heads of their group). dq, dk, dv are overwritten.
// Parallel over (batch, head) forward and (batch, kv head) backward; every work item runs the
// same sequence of operations whatever the thread count, so results are bitwise reproducible.
// Per-thread scratch is counted memory (see flash_attention_workspace_bytes).
#include <cstdint>

namespace fusetune::kernels {

struct AttentionDims {
  int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  // Gemma 2's score options (0: none): the sliding window and the soft-cap of the scores.
  int64_t window = 0;
  double softcap = 0.0;
};

inline constexpr int64_t kFlashBlockQ = 64;  // query rows per tile
inline constexpr int64_t kFlashBlockK = 64;  // keys per tile

template <class T>
void flash_attention_forward(const T* q, const T* k, const T* v, const int32_t* doc_ids, T* o,
                             T* lse, const AttentionDims& d, double scale);

template <class T>
void flash_attention_backward(const T* q, const T* k, const T* v, const T* o, const T* lse,
                              const T* dout, const int32_t* doc_ids, T* dq, T* dk, T* dv,
                              const AttentionDims& d, double scale);

// Bytes of scratch one call allocates with `threads` OpenMP threads (for the memory estimate).
int64_t flash_attention_workspace_bytes(const AttentionDims& d, int64_t elem_bytes, bool backward,
                                        int threads);

}  // namespace fusetune::kernels
