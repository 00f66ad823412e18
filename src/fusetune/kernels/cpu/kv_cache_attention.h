#pragma once
// Attention of new queries against a KV cache (generation: a prefill of T prompt tokens, then
// one token per decode step). The op first stores the new keys and values in the cache, then
// each query attends to every cached slot up to its own:
//
//   k_cache[b, cache_pos + t] = k[b, t];  v_cache[b, cache_pos + t] = v[b, t]
//   o[b, t, h] = softmax_j(scale q[b, t, h] . k_cache[b, j, h / G]) v_cache[b, j, h / G],
//                j in [cache_start[b], cache_pos + t]
//
// Layouts, row-major: q, o [B, T, H, hd]; k, v [B, T, KV, hd]; caches [B, S, KV, hd]; G = H / KV
// (GQA reads the shared kv head in place). cache_start[b] is the first real slot of row b: a
// batch of prompts is left-padded so that every row's next token lands in the same slot; a
// query with no visible slot (a padding query) gets o = 0. Scores and the weighted sum of
// values are BLAS matrix-vector products over strided cache rows; parallel over (b, t, h), each
// item computed the same way whatever the thread count.
#include <cstdint>

namespace fusetune::kernels {

struct KVCacheDims {
  int64_t batch = 0, queries = 0, heads = 0, kv_heads = 0, head_dim = 0, cache_len = 0;
  // Gemma 2's score options, as flash_attention.h's (0: none): a query sees only the last
  // `window` slots up to its own, and the scaled scores are capped to c tanh(s / c).
  int64_t window = 0;
  double softcap = 0.0;
};

template <class T>
void kv_cache_attention(const T* q, const T* k, const T* v, T* k_cache, T* v_cache,
                        int64_t cache_pos, const int32_t* cache_start, T* o, const KVCacheDims& d,
                        double scale);

}  // namespace fusetune::kernels
