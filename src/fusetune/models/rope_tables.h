#pragma once
// RoPE cos/sin tables [positions, head_dim/2] for Hugging Face's rotate-half convention, with
// Llama 3 frequency scaling (rope_scaling.rope_type == "llama3"), linear scaling and Phi-3's
// LongRoPE.
#include "fusetune/core/tensor.h"
#include "fusetune/models/model_config.h"

namespace fusetune {

// inv_freq[i] = rope_theta^(-2i/head_dim), then scaled as rope_scaling says. LongRoPE divides
// by short_factor[i], or by long_factor[i] when seq_len > original_max_position_embeddings.
std::vector<double> rope_inv_freq(const ModelConfig& cfg, int64_t seq_len = 0);
// cos and sin of position * inv_freq for positions [0, n_positions), in `dtype`; LongRoPE picks
// its factors by n_positions and multiplies both tables by its attention_factor.
std::pair<Tensor, Tensor> rope_tables(const ModelConfig& cfg, int64_t n_positions, DType dtype);

}  // namespace fusetune
