// One tiny model per supported family, written the way Hugging Face writes it (config.json
// keys of that family, BF16 safetensors with HF's tensor names spelled out here by hand), then
// loaded and run: the model graph's parameters are exactly the file's tensors.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/io/safetensors.h"
#include "fusetune/models/parameters.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/runtime/eager_executor.h"
#include "test_support.h"

using namespace fusetune;
using nlohmann::json;

namespace {

struct Family {
  const char* name;
  json config;
  bool qkv_bias, tied;
};

std::vector<std::pair<std::string, Shape>> hf_tensor_names(const Family& f) {
  // D 16, 4 heads of 4, 2 kv heads, ffn 24, vocab 32, 2 layers.
  std::vector<std::pair<std::string, Shape>> t = {{"model.embed_tokens.weight", {32, 16}},
                                                  {"model.norm.weight", {16}}};
  for (int i = 0; i < 2; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    t.push_back({p + "input_layernorm.weight", {16}});
    t.push_back({p + "post_attention_layernorm.weight", {16}});
    t.push_back({p + "self_attn.q_proj.weight", {16, 16}});
    t.push_back({p + "self_attn.k_proj.weight", {8, 16}});
    t.push_back({p + "self_attn.v_proj.weight", {8, 16}});
    t.push_back({p + "self_attn.o_proj.weight", {16, 16}});
    if (f.qkv_bias) {
      t.push_back({p + "self_attn.q_proj.bias", {16}});
      t.push_back({p + "self_attn.k_proj.bias", {8}});
      t.push_back({p + "self_attn.v_proj.bias", {8}});
    }
    t.push_back({p + "mlp.gate_proj.weight", {24, 16}});
    t.push_back({p + "mlp.up_proj.weight", {24, 16}});
    t.push_back({p + "mlp.down_proj.weight", {16, 24}});
  }
  if (!f.tied) t.push_back({"lm_head.weight", {32, 16}});
  return t;
}

json base_config(const char* type) {
  return {{"model_type", type},     {"hidden_size", 16},        {"intermediate_size", 24},
          {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
          {"vocab_size", 32},       {"rms_norm_eps", 1e-5},     {"max_position_embeddings", 64},
          {"hidden_act", "silu"},   {"torch_dtype", "bfloat16"}};
}

std::vector<Family> families() {
  json llama3 = base_config("llama");
  llama3["architectures"] = {"LlamaForCausalLM"};
  llama3["rope_theta"] = 500000.0;
  llama3["head_dim"] = 4;
  llama3["tie_word_embeddings"] = true;
  llama3["attention_bias"] = false;
  llama3["rope_scaling"] = {{"rope_type", "llama3"},
                            {"factor", 32.0},
                            {"low_freq_factor", 1.0},
                            {"high_freq_factor", 4.0},
                            {"original_max_position_embeddings", 8}};
  llama3["eos_token_id"] = {1, 2};
  json llama2 = base_config("llama");
  llama2["architectures"] = {"LlamaForCausalLM"};
  llama2["rope_scaling"] = nullptr;
  json mistral = base_config("mistral");
  mistral["architectures"] = {"MistralForCausalLM"};
  mistral["sliding_window"] = 4096;
  mistral["rope_theta"] = 1000000.0;
  json qwen2 = base_config("qwen2");
  qwen2["architectures"] = {"Qwen2ForCausalLM"};
  qwen2["tie_word_embeddings"] = true;
  qwen2["use_sliding_window"] = false;
  qwen2["sliding_window"] = 32768;
  return {{"llama3.2", llama3, false, true},
          {"llama2", llama2, false, false},
          {"mistral", mistral, false, false},
          {"qwen2", qwen2, true, true}};
}

}  // namespace

TEST(ModelFamilies, EachLoadsFromItsHfLayoutAndRuns) {
  for (const Family& f : families()) {
    SCOPED_TRACE(f.name);
    fusetune::testing::TempDir dir;
    std::ofstream(dir / "config.json") << f.config.dump(2);
    NamedTensors tensors;
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.f, 0.3f);
    for (const auto& [name, shape] : hf_tensor_names(f)) {
      Tensor t = Tensor::empty(shape, DType::F32);
      for (int64_t i = 0; i < t.numel(); ++i)
        t.data<float>()[i] = normal(rng) + (name.find("norm") != std::string::npos ? 1.f : 0.f);
      tensors.push_back({name, t.to(DType::BF16)});
    }
    save_safetensors(dir / "model.safetensors", tensors, {{"format", "pt"}});

    HFCheckpoint ck = load_hf_checkpoint(dir.path());
    EXPECT_EQ(ck.tensors.size(), tensors.size());
    Graph g = build_logits_graph(ck.config, 1, 5, DType::F32);
    TensorMap params;
    for (const ParamInfo& p : graph_parameters(g)) {
      ASSERT_TRUE(ck.tensors.count(p.name))
          << "the model wants " << p.name << ", which the file lacks";
      params[p.name] = ck.tensors.at(p.name);
    }
    EXPECT_EQ(graph_parameters(g).size(), tensors.size()) << "every tensor of the file is used";
    Tensor tok = Tensor::empty({1, 5}, DType::I32), pos = Tensor::empty({1, 5}, DType::I32);
    for (int i = 0; i < 5; ++i) {
      tok.data<int32_t>()[i] = 3 * i + 1;
      pos.data<int32_t>()[i] = i;
    }
    EagerExecutor ex(g);
    Tensor logits = ex.run({{"tokens", tok}, {"positions", pos}}, params)[0];
    ASSERT_EQ(logits.shape(), (Shape{5, 32}));
    double spread = 0;
    for (int64_t i = 0; i < logits.numel(); ++i) {
      ASSERT_TRUE(std::isfinite(logits.data<float>()[i]));
      spread += std::abs(logits.data<float>()[i]);
    }
    EXPECT_GT(spread, 1.0);
  }
}
