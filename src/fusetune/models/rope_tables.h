#pragma once
// RoPE cos/sin tables [positions, head_dim/2] for Hugging Face's rotate-half convention, with
// Llama 3 frequency scaling (rope_scaling.rope_type == "llama3") and linear scaling.
#include "fusetune/core/tensor.h"
#include "fusetune/models/model_config.h"

namespace fusetune {

// inv_freq[i] = rope_theta^(-2i/head_dim), then scaled as rope_scaling says.
std::vector<double> rope_inv_freq(const ModelConfig& cfg);
// cos and sin of position * inv_freq for positions [0, n_positions), in `dtype`.
std::pair<Tensor, Tensor> rope_tables(const ModelConfig& cfg, int64_t n_positions, DType dtype);

}  // namespace fusetune
