#pragma once
// The tiny random-init Llama the recipe tests train (byte tokenizer): its config text, and a
// Hugging Face checkpoint of it for the recipes that start from one.
#include <cstdint>
#include <filesystem>
#include <string>

namespace fusetune::testing {

// "model:" and its keys: init random, llama, vocabulary 259 (the byte tokenizer's), hidden 32,
// intermediate 64, 2 layers, 4 heads, 2 KV heads, `max_positions` positions. More model keys
// (LoRA's) may follow it, indented by two spaces.
std::string tiny_model_yaml(int64_t max_positions);

// LoRA keys for the model section (indented): rank 4, alpha 8 on q_proj and v_proj and the MLP,
// as the DPO recipe tests train.
std::string tiny_dpo_lora_yaml();

// A whole config the schema tests validate: output_dir /tmp/out, the model above but hidden 64
// and intermediate 176 (no model_type or positions), then `tokenizer` (a section, "" for
// none), a text_completion dataset (data/corpus.txt) and AdamW at lr 1e-3. One key a line,
// in that order (error messages name lines).
std::string tiny_config_yaml(const std::string& tokenizer);

// A PPO config's models for tiny Llama checkpoints: the policy and its frozen reference from
// `policy`, the value and reward models (torchtune's llama2_classifier, one class) from those
// classifier directories (with model_type REWARD where `reward_type`), the byte tokenizer with
// 10 tokens at most. One key a line; the recipe's other sections follow it.
std::string tiny_ppo_models_yaml(const std::filesystem::path& policy,
                                 const std::filesystem::path& value,
                                 const std::filesystem::path& reward, bool reward_type);

// A tiny Llama (2 layers, 4 heads, 2 kv heads, byte vocabulary 259, 128 positions, untied
// head; by default width 32 and intermediate 64) as a random fp32 checkpoint, written by
// `fusetune init-checkpoint --seed 3` to dir/ckpt (dir/arch holds its config.json); returns
// dir/ckpt. A failure is a test failure.
std::filesystem::path write_tiny_checkpoint(const std::filesystem::path& dir,
                                            int64_t hidden_size = 32,
                                            int64_t intermediate_size = 64);

}  // namespace fusetune::testing
