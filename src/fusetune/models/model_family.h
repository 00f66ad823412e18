#pragma once
// What sets one Llama-family architecture apart from the others, as data: the Hugging Face
// `model_type` a config.json names it by, transformers' defaults for the keys a config may
// leave out, llama.cpp's name for it, and the options that the one decoder builder
// (models/llama.cpp), the checkpoint reader and writer (io/) and the GGUF exporter consult.
// A family whose blocks are a Llama's with such options is one row of the table in
// model_family.cpp (docs/design.md §1).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fusetune {

// When a config's `sliding_window` is stored (it is only ever stored, and refused past its
// length): never, always (Mistral), or with `use_sliding_window: true` (Qwen2/3).
enum class SlidingWindowKey { Ignored, Always, WithUseSlidingWindow };

struct ModelFamily {
  std::string_view model_type;       // config.json's `model_type`
  std::string_view hf_architecture;  // the `architectures` entry written for a new model
  std::string_view gguf_arch;        // llama.cpp's general.architecture
  // transformers' defaults for keys a config.json may omit.
  int64_t default_max_position_embeddings;
  int64_t default_bos_token_id;  // -1: none
  int64_t default_eos_token_id;  // -1: none
  int64_t default_head_dim;      // 0: hidden_size / num_attention_heads
  // q/k/v projections carry biases: always (Qwen2, whose config has no `attention_bias` key),
  // or never (every other family; an `attention_bias: true` there is refused).
  bool qkv_bias;
  // An RMSNorm over each head of q and k (weights self_attn.q_norm / k_norm, [head_dim])
  // before RoPE (Qwen3).
  bool qk_norm;
  // llama.cpp rotates this family's q/k in interleaved pairs, HF in halves: the exporter
  // permutes q/k rows (llama, mistral). NEOX-style families (qwen2, qwen3) keep HF's layout.
  bool gguf_permutes_rope_rows;
  SlidingWindowKey sliding_window;
  // The keys this family's config.json spells out even at their defaults, written for a new
  // model: `attention_bias` and `mlp_bias`, and `rope_scaling: null`.
  bool writes_attention_bias, writes_mlp_bias, writes_null_rope_scaling;
  // Gemma's options; the Llama-family rows leave them at these defaults.
  // The config.json key naming the MLP gate's activation, and its value when absent: Gemma's
  // GeGLU reads `hidden_activation` (its `hidden_act` is a stale "gelu" transformers ignores).
  std::string_view activation_key = "hidden_act";
  std::string_view default_activation = "silu";
  bool default_tie_word_embeddings = false;
  // Every RMSNorm scales by (1 + w), w as stored (Gemma): the builder feeds the norm w + 1
  // (docs/design.md §1), and the GGUF exporter writes w + 1 as llama.cpp's gemma expects.
  bool norm_adds_one = false;
  // The token embeddings are multiplied by sqrt(hidden_size), rounded to the compute dtype
  // first as transformers does (Gemma).
  bool scales_embedding = false;
  // Gemma 2's options. Norms after attention and the MLP as well as before: the block is
  //   h += norm_pa(attn(norm_in(h)));  h += norm_pf(mlp(norm_ff(h)))
  // with post_attention_layernorm the attention output's norm (a Llama's pre-MLP norm) and
  // pre_/post_feedforward_layernorm the MLP's.
  bool post_norms = false;
  // attn_logit_softcapping / final_logit_softcapping are read, with these defaults (0: none),
  // and query_pre_attn_scalar (default: head_dim) sets the attention scale to its -1/2 power.
  bool reads_softcaps = false;
  double default_attn_softcap = 0.0, default_final_softcap = 0.0;
  bool reads_query_pre_attn_scalar = false;
  // Layers that attend within `sliding_window` (its default here): config.json's layer_types,
  // or when absent of every `sliding_pattern` layers all but the last (Gemma 2: 2, even layers
  // local). 0: no layer is windowed.
  int64_t sliding_pattern = 0;
  int64_t default_sliding_window = 0;
  // Gemma 3's: rope_theta's default, and the local layers' RoPE base `rope_local_base_freq`
  // (read when this default is > 0); sliding_window_pattern, when given, overrides the pattern.
  double default_rope_theta = 10000.0;
  double default_rope_local_base_freq = 0.0;
  // Phi-3 / Phi-4: q, k and v are one projection `self_attn.qkv_proj` [(H + 2 KV) head_dim,
  // hidden] (q rows, then k, then v) and gate and up one `mlp.gate_up_proj` [2 ffn, hidden]
  // (gate rows first), as the checkpoint stores them; the builder slices the product
  // (docs/design.md §1).
  bool fused_projections = false;
  // transformers' rms_norm_eps when config.json leaves it out (Phi3Config's is 1e-5).
  double default_rms_norm_eps = 1e-6;
  // The multimodal checkpoint this family's text model also comes in (Gemma 3's
  // Gemma3ForConditionalGeneration): its config.json's model_type, which holds this family's
  // keys under `text_config`; empty: none.
  std::string_view multimodal_model_type = "";
  // transformers' defaults (JSON) for the sizes a multimodal config's text_config may leave out,
  // which a text model's own config.json must give (Gemma3TextConfig's: the 4B's text_config
  // names neither heads nor vocabulary).
  std::string_view multimodal_text_defaults = "";
};

// transformers' name of the tanh-approximated GELU: Gemma's GeGLU gate (Op::GeluTanh); the
// other activation the builder knows is silu (or its alias swish).
inline constexpr const char* kGeluTanh = "gelu_pytorch_tanh";

struct ModelConfig;
// Whether layer `layer` attends within config.sliding_window (Gemma 2's local layers).
bool is_sliding_layer(const ModelConfig& config, int64_t layer);

// One decoder layer's projection weights as the family stores them: the module under
// "model.layers.N." ("self_attn.q_proj", or Phi-3's "self_attn.qkv_proj"), [out, in].
struct LayerProjection {
  std::string module;
  int64_t out = 0, in = 0;
};
std::vector<LayerProjection> layer_projections(const ModelConfig& config);

// The family whose text model a multimodal config.json's model_type (`gemma3`) holds, or null.
const ModelFamily* multimodal_family(std::string_view model_type);

// The module path of the text model's `name` ("model.layers.0.self_attn.q_proj...",
// "lm_head...") in its multimodal model (ModelConfig::multimodal_text_prefix), as PEFT names
// an adapter there; `name` itself for a text model.
std::string multimodal_module_name(const ModelConfig& config, const std::string& name);

// Every family fusetune builds, in the order error messages list them.
const std::vector<ModelFamily>& model_families();

// The family of `model_type`; throws fusetune::Error naming `where`, the supported families
// and the closest one.
const ModelFamily& model_family(std::string_view model_type, const std::string& where = "");

// transformers' sequence-classification class of a family ("LlamaForSequenceClassification"):
// its causal-LM architecture with ForCausalLM replaced (docs/design.md §12).
std::string sequence_classification_architecture(const ModelFamily& family);

// "llama, mistral, qwen2, qwen3": for messages and schema docs.
std::string model_type_list();

}  // namespace fusetune
