#pragma once
// LoRA and DoRA adapters (PEFT semantics) on the Llama model's linear layers.
//
//   LoRA: y = x W^T + s * (dropout(x) A^T) B^T,  s = alpha / r,
//         A [r, in] ~ U(-1/sqrt(in), 1/sqrt(in)) (PEFT's kaiming_uniform_(a=sqrt(5))), B [out, r] =
//         0 so the model at step 0 is the base model.
//   DoRA: y = (m / ||W + s B A||_row) * (x W^T + s * (dropout(x) A^T) B^T), m [out] initialized to
//         the row norms of W; the norm is detached (no gradient flows through it), as PEFT does.
//
// Parameter names are PEFT's without the "base_model.model." prefix:
//   model.layers.0.self_attn.q_proj.lora_A.weight, ...lora_B.weight, ...lora_magnitude_vector.
// Base weights stay frozen (not trainable: no gradient, no optimizer state); with
// quantize_base they are NF4 (peft/nf4_weight.h).
#include <memory>
#include <string>
#include <vector>

#include "fusetune/models/llama.h"
#include "fusetune/peft/nf4_weight.h"

namespace fusetune::peft {

struct LoraConfig {
  // torchtune's attention module names: q_proj, k_proj, v_proj, output_proj.
  std::vector<std::string> attn_modules = {"q_proj", "v_proj"};
  bool apply_to_mlp = false;
  bool apply_to_output = false;
  int64_t rank = 8;
  double alpha = 16;
  double dropout = 0.0;
  bool use_dora = false;
  bool quantize_base = false;

  double scale() const { return alpha / double(rank); }
  void validate() const;  // throws fusetune::Error naming the key at fault
};

// Hugging Face module names that get adapters ("q_proj", "o_proj", "gate_proj", "lm_head"...),
// as PEFT's adapter_config.json lists target_modules. `fused`: the model stores Phi-3's fused
// projections, so any of q/k/v is "qkv_proj" and the MLP's gate and up are "gate_up_proj".
std::vector<std::string> target_modules(const LoraConfig& c, bool fused = false);
// The inverse: torchtune-style config from PEFT target_modules (o_proj -> output_proj,
// qkv_proj -> q_proj, k_proj, v_proj, ...).
void set_targets_from_hf(LoraConfig& c, const std::vector<std::string>& hf_modules);

// Phi-3's fused projections (docs/design.md §1). An adapter on qkv_proj is PEFT's: one
// lora_A [r, in] and one lora_B [(H + 2 KV) hd, r], so q, k and v share A and each has its
// rows of B. A config that targets only some of q/k/v gets that adapter with the rows of B of
// the others held at 0 (B times a 0/1 row mask), which PEFT loads as it is. Whether each row
// block of a fused site is adapted (empty: the site is not fused).
std::vector<bool> adapted_parts(const LoraConfig& c, const LinearSite& site);

// The linear layers of `model` that carry an adapter (module, out, in, weight name).
std::vector<LinearSite> lora_sites(const ModelConfig& model, const LoraConfig& c);

bool is_adapter_param(const std::string& name);

// Adds freshly initialized adapter parameters to `params` (which must hold the base weights of
// the targeted layers, or `nf4` must). Deterministic in `seed`.
void init_adapters(TensorMap& params, const ModelConfig& model, const LoraConfig& c, uint64_t seed,
                   DType dtype, const NF4Store* nf4 = nullptr);

// The model hooks: targeted layers get adapters, NF4 base weights (when `nf4` holds the
// layer's weight) replace the float Param; an NF4 embedding table is gathered from NF4 and an
// NF4 head (or a tied head whose table is NF4) computes the logits by NF4MatMul (fused with
// the loss under compile: true). `dropout_seed` names the [] I32 graph input that
// seeds lora_dropout (fed per step); it is only created when dropout > 0.
// `base`: computes the frozen base's product instead of a float Param (QAT's fake-quantized
// linears, quant/qat.h): base.linear for the layers, base.head for lm_head (when set), and
// base.embedding replaces the embedding; not with `nf4` or DoRA.
LlamaOptions lora_llama_options(const LoraConfig& c, std::shared_ptr<const NF4Store> nf4 = nullptr,
                                const LlamaOptions* base = nullptr);

// The frozen base alone, adapters disabled (torchtune's disable_adapter; the LoRA-DPO
// reference model): NF4 weights where `nf4` holds them, the float parameters elsewhere.
LlamaOptions base_llama_options(std::shared_ptr<const NF4Store> nf4 = nullptr);

inline constexpr const char* kDropoutSeedInput = "lora_dropout_seed";

}  // namespace fusetune::peft
