#pragma once
// PEFT adapter directories (what `model.save_pretrained` writes for a LoRA/DoRA adapter):
//   adapter_config.json        peft_type LORA, task_type CAUSAL_LM, r, lora_alpha, lora_dropout,
//                              target_modules (HF names), use_dora, bias "none",
//                              base_model_name_or_path
//   adapter_model.safetensors  "base_model.model." + our names
// and merging an adapter into its base weights. A sequence classifier's adapter (the LoRA
// reward model) also holds its `score` head, trained in full: task_type SEQ_CLS,
// modules_to_save ["score"], the tensor "base_model.model.score.weight", as PEFT saves it.
#include <filesystem>
#include <string>

#include "fusetune/peft/lora.h"

namespace fusetune::peft {

inline const std::string kScoreWeight = "score.weight";

struct Adapter {
  LoraConfig config;
  // our names (model.layers.0.self_attn.q_proj.lora_A.weight ...), F32; with
  // modules_to_save: [score], also kScoreWeight
  TensorMap tensors;
  std::string base_model_name_or_path;
};

// `model`, when given and the text model of a multimodal checkpoint
// (ModelConfig::multimodal_text_prefix): the tensors go by the multimodal model's module paths
// ("base_model.model.language_model.model.layers...") and target_modules is a regex string
// that matches the language model's modules only (PEFT would match a list of names in the
// vision tower too).
void save_peft_adapter(const std::filesystem::path& dir, const LoraConfig& c,
                       const TensorMap& params, const std::string& base_model_name_or_path,
                       const ModelConfig* model = nullptr);

// Reads and checks an adapter directory: every targeted layer of `model` must have its A and B
// (and magnitude with DoRA) with the right shapes; throws fusetune::Error naming file and key.
// A multimodal model's text model reads the names and target_modules save_peft_adapter writes.
Adapter load_peft_adapter(const std::filesystem::path& dir, const ModelConfig& model);

// Merges the adapters of `params` (our names) into the base weights of `params` in place:
// W += s B A, and with DoRA W = m / ||W + s B A||_row * (W + s B A). Adapter tensors are then
// removed. A tied head cannot take an lm_head adapter (it would change the embedding).
void merge_adapters(TensorMap& params, const ModelConfig& model, const LoraConfig& c);

}  // namespace fusetune::peft
