#pragma once
// The graph of one generation step (docs/design.md §9): T new tokens per row run through the
// model against the KV cache, which the step extends in place (Op::KVCacheAttention); the head
// reads only each row's last position. The prefill is this graph with T = the prompt length, each
// decode step the same graph with T = 1, so both compile like the training step.
//
// Inputs: "tokens", "positions" [B, T] I32; "cache_pos" [] I32 (the cache slot of the first
// new token); "cache_start" [B] I32 (each row's first real slot: prompts are left-padded);
// "kv_cache.k.<layer>", "kv_cache.v.<layer>" [B, cache_len, KV, hd] (generation/kv_cache.h).
// Output: "logits" [B, V].
#include "fusetune/graph/graph.h"
#include "fusetune/models/llama.h"

namespace fusetune {

Graph build_decode_graph(const ModelConfig& cfg, int64_t batch, int64_t tokens, int64_t cache_len,
                         DType dtype, const LlamaOptions& llama = {});

}  // namespace fusetune
