#pragma once
// The Llama family (Llama 2/3/3.x, Mistral, Qwen2), written once against the graph builder.
// Parameter names are Hugging Face's, so checkpoints load and save without renaming.
#include <functional>
#include <string>

#include "fusetune/graph/builder.h"
#include "fusetune/models/model_config.h"

namespace fusetune {

struct LlamaInputs {
  Value tokens;     // [B, T] I32
  Value positions;  // [B, T] I32
  Value doc_ids;    // [B, T] I32, or invalid for plain causal attention
};

struct LlamaOutputs {
  Value hidden;   // [B*T, D] after the final norm
  Value lm_head;  // [V, D]: lm_head.weight, or embed_tokens when tied
};

using TrainablePredicate = std::function<bool(const std::string& param_name)>;

LlamaOutputs build_llama(Builder& b, const ModelConfig& cfg, const LlamaInputs& in,
                         const TrainablePredicate& trainable);

}  // namespace fusetune
