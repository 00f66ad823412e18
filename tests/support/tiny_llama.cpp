#include "tiny_llama.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "files.h"
#include "recipe_runs.h"

namespace fusetune::testing {

std::string tiny_model_yaml(int64_t max_positions) {
  return "model:\n  init: random\n  model_type: llama\n  vocab_size: 259\n  hidden_size: 32\n"
         "  intermediate_size: 64\n  num_hidden_layers: 2\n  num_attention_heads: 4\n"
         "  num_key_value_heads: 2\n  max_position_embeddings: " +
         std::to_string(max_positions) + "\n";
}

std::string tiny_dpo_lora_yaml() {
  return "  lora_attn_modules: [q_proj, v_proj]\n  apply_lora_to_mlp: true\n  lora_rank: 4\n"
         "  lora_alpha: 8\n";
}

std::string tiny_ppo_models_yaml(const std::filesystem::path& policy,
                                 const std::filesystem::path& value,
                                 const std::filesystem::path& reward, bool reward_type) {
  const std::string type = reward_type ? "  model_type: REWARD\n" : "";
  return "policy_model:\n  _component_: torchtune.models.llama2.llama2\n"
         "reward_and_value_model:\n  _component_: torchtune.models.llama2.llama2_classifier\n"
         "  num_classes: 1\n"
         "checkpointer:\n  checkpoint_dir: " +
         policy.string() + "\nref_policy_checkpointer:\n  checkpoint_dir: " + policy.string() +
         "\nvalue_checkpointer:\n  checkpoint_dir: " + value.string() + "\n" + type +
         "reward_checkpointer:\n  checkpoint_dir: " + reward.string() + "\n" + type +
         "tokenizer:\n  _component_: byte\n  max_seq_len: 10\n";
}

std::string tiny_config_yaml(const std::string& tokenizer) {
  return "output_dir: /tmp/out\nmodel:\n  init: random\n  vocab_size: 259\n  hidden_size: 64\n"
         "  intermediate_size: 176\n  num_hidden_layers: 2\n  num_attention_heads: 4\n"
         "  num_key_value_heads: 2\n" +
         tokenizer +
         "dataset:\n  _component_: text_completion\n  source: data/corpus.txt\n"
         "optimizer:\n  _component_: AdamW\n  lr: 1e-3\n";
}

std::filesystem::path write_tiny_checkpoint(const std::filesystem::path& dir, int64_t hidden_size,
                                            int64_t intermediate_size) {
  std::filesystem::create_directories(dir / "arch");
  write_text(dir / "arch" / "config.json", nlohmann::json({{"architectures", {"LlamaForCausalLM"}},
                                                           {"model_type", "llama"},
                                                           {"vocab_size", 259},
                                                           {"hidden_size", hidden_size},
                                                           {"intermediate_size", intermediate_size},
                                                           {"num_hidden_layers", 2},
                                                           {"num_attention_heads", 4},
                                                           {"num_key_value_heads", 2},
                                                           {"max_position_embeddings", 128},
                                                           {"rms_norm_eps", 1e-5},
                                                           {"rope_theta", 10000.0},
                                                           {"tie_word_embeddings", false}})
                                               .dump());
  const std::filesystem::path out = dir / "ckpt";
  const CliRun r = run_shell(shell_quote(binary_path()) + " init-checkpoint --config " +
                                 shell_quote((dir / "arch" / "config.json").string()) +
                                 " --output " + shell_quote(out.string()) + " --seed 3",
                             dir / "s_init");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  return out;
}

}  // namespace fusetune::testing
