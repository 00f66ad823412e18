#include "fusetune/models/model_family.h"

#include "fusetune/models/model_config.h"

#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune {

const std::vector<ModelFamily>& model_families() {
  using SW = SlidingWindowKey;
  // clang-format off
  static const std::vector<ModelFamily> families = {
      // model_type  HF architecture        GGUF     max pos   bos  eos  head_dim
      {"llama",   "LlamaForCausalLM",   "llama",  2048,     1,  2,  0,
       /*qkv_bias=*/false, /*qk_norm=*/false, /*permute=*/true,  SW::Ignored,
       /*writes attention_bias, mlp_bias, null rope_scaling=*/true,  true,  true},
      {"mistral", "MistralForCausalLM", "llama",  4096 * 32, 1,  2,  0,
       false, false, true,  SW::Always,
       false, false, false},
      {"qwen2",   "Qwen2ForCausalLM",   "qwen2",  32768,   -1, -1,  0,
       true,  false, false, SW::WithUseSlidingWindow,
       false, false, false},
      {"qwen3",   "Qwen3ForCausalLM",   "qwen3",  32768,   -1, -1,  128,
       false, true,  false, SW::WithUseSlidingWindow,
       true,  false, true},
      // Gemma: GeGLU (tanh GELU), RMSNorm scaling by 1 + w, embeddings times sqrt(hidden).
      {"gemma",   "GemmaForCausalLM",   "gemma",  8192,     2,  1,  256,
       false, false, false, SW::Ignored,
       true,  false, false,
       /*activation=*/"hidden_activation", "gelu_pytorch_tanh", /*tied=*/true,
       /*norm_adds_one=*/true, /*scales_embedding=*/true},
      // Gemma 2: Gemma's blocks with post-norms, soft-capped attention scores and logits, and
      // sliding-window (local) layers alternating with global ones.
      {"gemma2",  "Gemma2ForCausalLM",  "gemma2", 8192,     2,  1,  256,
       false, false, false, SW::Always,
       true,  false, false,
       "hidden_activation", "gelu_pytorch_tanh", true,
       true,  true,
       /*post_norms=*/true, /*softcaps: attention, final=*/true, 50.0, 30.0,
       /*query_pre_attn_scalar=*/true, /*sliding_pattern=*/2, /*sliding_window=*/4096},
      // Gemma 3 (text): Gemma 2's blocks with Gemma-style q/k norms, five local layers to each
      // global one, local layers on their own RoPE base, no soft-caps.
      {"gemma3_text", "Gemma3ForCausalLM", "gemma3", 131072, 2, 1,  256,
       false, true,  false, SW::Always,
       true,  false, false,
       "hidden_activation", "gelu_pytorch_tanh", true,
       true,  true,
       true,  true,  0.0, 0.0,
       true,  6,     4096,
       /*rope_theta=*/1000000.0, /*rope_local_base_freq=*/10000.0, false, 1e-6,
       /*multimodal_model_type=*/"gemma3",
       R"({"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
           "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4})"},
      // Phi-3 / Phi-4 (HF Phi3ForCausalLM): a Llama with fused qkv_proj and gate_up_proj.
      {"phi3",    "Phi3ForCausalLM",    "phi3",   4096,     1,  32000, 0,
       false, false, false, SW::Always,
       false, false, true,
       "hidden_act", "silu", false,
       false, false,
       false, false, 0.0, 0.0,
       false, 0,     0,
       10000.0, 0.0, /*fused_projections=*/true, /*rms_norm_eps=*/1e-5},
  };
  // clang-format on
  return families;
}

const ModelFamily* multimodal_family(std::string_view model_type) {
  for (const ModelFamily& f : model_families())
    if (!f.multimodal_model_type.empty() && f.multimodal_model_type == model_type) return &f;
  return nullptr;
}

std::string multimodal_module_name(const ModelConfig& c, const std::string& name) {
  const std::string& prefix = c.multimodal_text_prefix;
  if (prefix.empty()) return name;
  if (name.rfind("model.", 0) == 0) return prefix + name.substr(6);
  // lm_head sits beside "model." in the language model: language_model.lm_head, or at the top.
  if (name.rfind("lm_head.", 0) == 0 && prefix.rfind("language_model.", 0) == 0)
    return "language_model." + name;
  return name;
}

bool is_sliding_layer(const ModelConfig& config, int64_t layer) {
  return size_t(layer) < config.layer_types.size() &&
         config.layer_types[size_t(layer)] == "sliding_attention";
}

std::string sequence_classification_architecture(const ModelFamily& family) {
  std::string arch(family.hf_architecture);
  const std::string causal = "ForCausalLM";
  if (arch.size() > causal.size() &&
      arch.compare(arch.size() - causal.size(), causal.size(), causal) == 0)
    arch.resize(arch.size() - causal.size());
  return arch + "ForSequenceClassification";
}

std::vector<LayerProjection> layer_projections(const ModelConfig& c) {
  const int64_t D = c.hidden_size, F = c.intermediate_size, hd = c.head_dim;
  const int64_t q = c.num_attention_heads * hd, kv = c.num_key_value_heads * hd;
  if (model_family(c.model_type).fused_projections)
    return {{"self_attn.qkv_proj", q + 2 * kv, D},
            {"self_attn.o_proj", D, q},
            {"mlp.gate_up_proj", 2 * F, D},
            {"mlp.down_proj", D, F}};
  return {{"self_attn.q_proj", q, D}, {"self_attn.k_proj", kv, D}, {"self_attn.v_proj", kv, D},
          {"self_attn.o_proj", D, q}, {"mlp.gate_proj", F, D},     {"mlp.up_proj", F, D},
          {"mlp.down_proj", D, F}};
}

std::string model_type_list() {
  std::vector<std::string> names;
  for (const ModelFamily& f : model_families()) names.emplace_back(f.model_type);
  return join(names, ", ");
}

const ModelFamily& model_family(std::string_view model_type, const std::string& where) {
  std::vector<std::string> names;
  for (const ModelFamily& f : model_families()) {
    if (f.model_type == model_type) return f;
    names.emplace_back(f.model_type);
  }
  const std::string hint = closest_match(model_type, names);
  throw Error((where.empty() ? "" : where + ": ") + "model_type '" + std::string(model_type) +
              "' is not supported (supported: " + join(names, ", ") +
              (hint.empty() ? "" : "; did you mean '" + hint + "'?") + ")");
}

}  // namespace fusetune
