#pragma once
// The Llama family (Llama 2/3/3.x, Mistral, Qwen2, Qwen3), written once against the graph
// builder; what differs between them is data (models/model_family.h). Parameter names are
// Hugging Face's, so checkpoints load and save without renaming.
#include <functional>
#include <string>
#include <vector>

#include "fusetune/graph/builder.h"
#include "fusetune/models/model_config.h"

namespace fusetune {

struct LlamaInputs {
  Value tokens;     // [B, T] I32
  Value positions;  // [B, T] I32
  Value doc_ids;    // [B, T] I32, or invalid for plain causal attention
  // Generation with a KV cache of cache_len slots (0: none). Each layer's attention then reads
  // and extends the graph inputs "kv_cache.k.<layer>" / "kv_cache.v.<layer>" [B, cache_len,
  // KV, hd] (Op::KVCacheAttention); cache_pos [] I32 is the slot of the first query token and
  // cache_start [B] I32 each row's first real slot (left padding).
  int64_t cache_len = 0;
  Value cache_pos;
  Value cache_start;
};

struct LlamaOutputs {
  Value hidden;   // [B*T, D] after the final norm
  Value lm_head;  // [V, D]: lm_head.weight, or embed_tokens when tied (invalid when `logits`)
  Value logits;   // [B*T, V] only when LlamaOptions::head is set
  // A sequence classifier (ModelConfig::num_labels > 0) has no LM head: `score.weight`
  // [num_labels, D] at every position, [B*T, num_labels] (docs/design.md §12).
  Value scores;
};

using TrainablePredicate = std::function<bool(const std::string& param_name)>;

// One linear layer of the model, named as Hugging Face names the module
// ("model.layers.0.self_attn.q_proj"); weight [out, in]; its bias (if any) is added by the model.
struct LinearSite {
  std::string module;
  int64_t out = 0, in = 0;
  bool trainable = false;  // what the predicate says of `weight`
  std::string weight;      // the weight's parameter name: module + ".weight", except a tied
                           // head (module "lm_head", weight "model.embed_tokens.weight")
  // A fused projection's row blocks, in order (Phi-3's qkv_proj: q, k, v; gate_up_proj: gate,
  // up); empty for a plain one. LoRA reads it to adapt only some of the blocks.
  std::vector<int64_t> parts = {};
};

// Computes x W^T for a site: x [..., in] -> [..., out]. It creates whatever leaves it needs
// (the default: Param module + ".weight"). PEFT adapters and NF4 base weights plug in here.
using LinearFn = std::function<Value(Builder& b, Value x, const LinearSite& site)>;

// The plain linear: Param `site.weight` and b.linear(x, W).
Value default_linear(Builder& b, Value x, const LinearSite& site);

// Token embeddings: ids [B, T] I32 -> [B, T, D] for the table `site.weight` [V, D] (site
// "model.embed_tokens", out = V, in = D). NF4 base weights plug in here.
using EmbeddingFn = std::function<Value(Builder& b, Value ids, const LinearSite& site)>;

struct LlamaOptions {
  LinearFn linear;  // for the q/k/v/o and MLP projections; empty = default_linear
  // Applied to the head (site "lm_head") instead of returning it in LlamaOutputs (LoRA on
  // lm_head, an NF4 head): when set, LlamaOutputs::logits is head(hidden) [B*T, V].
  LinearFn head;
  // Replaces Param "model.embed_tokens.weight" + Embedding (an NF4 table). A tied model with
  // an embedding hook needs a head hook too (there is no float table to reuse as the head).
  EmbeddingFn embedding;
  // Only each sequence's last position goes through the final norm's output to the head
  // (generation): LlamaOutputs::hidden is then [B, D] and logits [B, V].
  bool last_position_only = false;
};

LlamaOutputs build_llama(Builder& b, const ModelConfig& cfg, const LlamaInputs& in,
                         const TrainablePredicate& trainable, const LlamaOptions& options = {});

}  // namespace fusetune
