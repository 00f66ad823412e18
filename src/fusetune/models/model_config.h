#pragma once
// The architecture of a decoder-only Llama-family model, as read from a Hugging Face
// config.json (model_type llama, mistral, qwen2, qwen3 or gemma: models/model_family.h). `raw`
// keeps the original JSON so a saved checkpoint's config.json carries every field the user's tools
// expect, not only ours.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fusetune {

struct RopeScaling {
  std::string rope_type;  // "" (none), "llama3", "linear", "longrope"
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
  // LongRoPE (Phi-3's 128k models): per-frequency divisors of the inverse frequencies, the
  // long ones for sequences longer than original_max_position_embeddings, and the scale of
  // cos and sin (transformers' _compute_longrope_parameters).
  std::vector<double> short_factor, long_factor;
  double attention_factor = 1.0;
};

struct ModelConfig {
  std::string model_type = "llama";
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // = num_attention_heads when absent (no GQA)
  int64_t head_dim = 0;             // = hidden_size / num_attention_heads when absent
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v projections have biases (Qwen2)
  bool mlp_bias = false;
  std::string hidden_act = "silu";  // the MLP gate's activation: silu or gelu_pytorch_tanh
                                    // (config.json's hidden_act; Gemma's hidden_activation)
  int64_t bos_token_id = -1;
  int64_t eos_token_id = -1;           // the first of eos_token_ids
  std::vector<int64_t> eos_token_ids;  // config.json may list several (Llama 3.1)
  int64_t sliding_window = 0;          // the window; 0 = none (Mistral/Qwen2: stored, not applied)
  // Gemma 2 (0: none): the soft-caps of the attention scores and of the final logits, and the
  // attention scale's base (scale = query_pre_attn_scalar^-1/2 instead of head_dim^-1/2).
  double attn_logit_softcapping = 0.0;
  double final_logit_softcapping = 0.0;
  double query_pre_attn_scalar = 0.0;
  // Gemma 3: the RoPE base of the sliding_attention layers, unscaled (0: rope_theta and
  // rope_scaling on every layer).
  double rope_local_base_freq = 0.0;
  // Per layer, "sliding_attention" (attends within sliding_window) or "full_attention"; empty
  // for families without windowed layers (models/model_family.h).
  std::vector<std::string> layer_types;
  // A sequence classifier (transformers' *ForSequenceClassification, a reward or value model):
  // the LM head is replaced by `score.weight` [num_labels, hidden_size] (no bias), read at each
  // sequence's last real token (docs/design.md §12). 0: a causal LM.
  int64_t num_labels = 0;
  // config.json's pad_token_id (-1: none), which a classifier's checkpoint keeps.
  int64_t pad_token_id = -1;
  nlohmann::json raw;  // the config.json as read (or as built for a new model)
  // A text model inside a multimodal checkpoint (Gemma 3's Gemma3ForConditionalGeneration:
  // config.json's model_type `gemma3` with the text model's keys under `text_config`, tensors
  // under `language_model.`): `raw` is then the text_config block and `multimodal` the whole
  // config.json, whose text_config a save rewrites (io/hf_checkpoint.h). Null otherwise.
  nlohmann::json multimodal;
  // The token ids (bos/eos/pad_token_id) the text model took from the outer config.json because
  // its text_config has none; a save leaves them there.
  std::vector<std::string> ids_from_multimodal;
  // The checkpoint directory (and its checkpoint_files, when given) whose other tensors (vision
  // tower, projector) a save carries through unchanged; empty: none to carry.
  std::string multimodal_source_dir;
  std::vector<std::string> multimodal_source_files;
  // Where the text model's "model." sits in the multimodal model's module tree, as its
  // checkpoint names it: "language_model.model." (lm_head at "language_model.lm_head") or
  // "model.language_model." (lm_head at "lm_head"); "" when unknown (models/model_family.h's
  // multimodal_module_name).
  std::string multimodal_text_prefix;
};

}  // namespace fusetune
