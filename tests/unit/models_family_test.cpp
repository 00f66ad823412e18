// models/model_family: each family's row is what config.json parsing, the parameter list, the
// recipe schema and GGUF export act on. Qwen3: q/k norms, head_dim 128 by default, no biases.
// Gemma: hidden_activation, head_dim 256, tied by default.
#include "fusetune/models/model_family.h"

#include <algorithm>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "fusetune/config/recipe_schemas.h"
#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/io/hf_config.h"
#include "fusetune/util/error.h"
#include "fusetune/util/fs.h"
#include "test_support.h"

using nlohmann::json;

namespace fusetune {
namespace {

json minimal(const std::string& model_type) {
  return json{{"model_type", model_type}, {"vocab_size", 100},      {"hidden_size", 64},
              {"intermediate_size", 128}, {"num_hidden_layers", 1}, {"num_attention_heads", 4}};
}

std::string error_of(const json& j) {
  try {
    parse_model_config(j, "c.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ModelFamilies, EveryFamilyParsesSavesAndParsesBackTheSame) {
  for (const ModelFamily& f : model_families()) {
    const std::string type(f.model_type);
    SCOPED_TRACE(type);
    const ModelConfig c = parse_model_config(minimal(type), "c.json");
    EXPECT_EQ(&model_family(c.model_type), &f);
    EXPECT_EQ(c.attention_bias, f.qkv_bias);
    EXPECT_EQ(c.max_position_embeddings, f.default_max_position_embeddings);
    EXPECT_EQ(c.bos_token_id, f.default_bos_token_id);
    EXPECT_EQ(c.eos_token_id, f.default_eos_token_id);
    EXPECT_EQ(c.head_dim, f.default_head_dim > 0 ? f.default_head_dim : 16);
    ModelConfig fresh = c;
    fresh.raw = json();  // a new model: everything from the family's row
    const json written = model_config_to_json(fresh);
    EXPECT_EQ(written["architectures"], json::array({std::string(f.hf_architecture)}));
    EXPECT_EQ(written.contains("attention_bias"), f.writes_attention_bias);
    EXPECT_EQ(written.contains("mlp_bias"), f.writes_mlp_bias);
    EXPECT_EQ(written.contains("rope_scaling"), f.writes_null_rope_scaling);
    const ModelConfig back = parse_model_config(written, "written.json");
    EXPECT_EQ(back.head_dim, c.head_dim);
    EXPECT_EQ(back.attention_bias, c.attention_bias);
    EXPECT_EQ(expected_parameters(back), expected_parameters(c));
  }
}

// Every family's checkpoint (BF16, as published) saved, loaded and saved again: the tensor file
// and config.json repeat byte for byte, and the loaded tensors are the saved ones.
TEST(ModelFamilies, EveryFamilyCheckpointSavesLoadsAndSavesBackByteForByte) {
  for (const ModelFamily& f : model_families()) {
    const std::string type(f.model_type);
    SCOPED_TRACE(type);
    json j = minimal(type);
    j["head_dim"] = 16;  // not 128 / 256: a small file
    j["num_key_value_heads"] = 2;
    const ModelConfig c = parse_model_config(j, "c.json");
    NamedTensors tensors;
    uint64_t seed = 1;
    for (const auto& [name, shape] : expected_parameters(c)) {
      Tensor t = Tensor::empty(shape, DType::F32);
      for (int64_t i = 0; i < t.numel(); ++i)
        t.data<float>()[i] = float(int64_t((seed++ * 2654435761u) % 2001) - 1000) / 997.0f;
      tensors.push_back({name, t.to(DType::BF16)});
    }
    testing::TempDir tmp;
    SaveOptions bf16;
    bf16.dtype = DType::BF16;
    save_hf_checkpoint(tmp / "a", c, tensors, bf16);
    const HFCheckpoint a = load_hf_checkpoint(tmp / "a", {}, DType::BF16);
    NamedTensors again;
    for (const auto& [name, t] : tensors) {
      ASSERT_TRUE(a.tensors.count(name)) << name;
      const Tensor& got = a.tensors.at(name);
      ASSERT_EQ(got.nbytes(), t.nbytes()) << name;
      EXPECT_EQ(std::memcmp(got.raw(), t.raw(), t.nbytes()), 0) << name;
      again.push_back({name, got});
    }
    save_hf_checkpoint(tmp / "b", a.config, again, bf16);
    for (const char* file : {"model.safetensors", "config.json"})
      EXPECT_TRUE(read_file(tmp / "a" / file) == read_file(tmp / "b" / file)) << file;
  }
}

TEST(ModelFamilies, UnknownTypeNamesEveryFamilyAndTheClosest) {
  const std::string msg = error_of(minimal("qwen4"));
  EXPECT_NE(msg.find("c.json: model_type 'qwen4' is not supported"), std::string::npos) << msg;
  EXPECT_NE(msg.find(model_type_list()), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'qwen"), std::string::npos) << msg;
}

// The recipe schema's `model.model_type` (config/ cannot include models/) lists the families.
TEST(ModelFamilies, TheRecipeSchemaListsEveryFamily) {
  const Field model = model_field(false);
  const auto it = std::find_if(model.fields.begin(), model.fields.end(),
                               [](const Field& f) { return f.name == "model_type"; });
  ASSERT_NE(it, model.fields.end());
  std::vector<std::string> families;
  for (const ModelFamily& f : model_families()) families.emplace_back(f.model_type);
  EXPECT_EQ(it->allowed, families);
}

TEST(ModelFamilies, Qwen3HasQkNormsHeadDim128AndNoBiases) {
  const ModelConfig c = parse_model_config(minimal("qwen3"), "c.json");
  EXPECT_EQ(c.head_dim, 128);  // transformers' Qwen3Config default, not hidden_size / heads
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.sliding_window, 0);
  const auto params = expected_parameters(c);
  auto shape_of = [&](const std::string& name) {
    for (const auto& [n, s] : params)
      if (n == name) return s;
    return Shape{};
  };
  EXPECT_EQ(shape_of("model.layers.0.self_attn.q_norm.weight"), (Shape{128}));
  EXPECT_EQ(shape_of("model.layers.0.self_attn.k_norm.weight"), (Shape{128}));
  EXPECT_EQ(shape_of("model.layers.0.self_attn.q_proj.weight"), (Shape{4 * 128, 64}));
  EXPECT_EQ(shape_of("model.layers.0.self_attn.q_proj.bias"), Shape{});
  // Only Qwen2's q/k/v biases are modelled; Qwen3's attention_bias also covers o_proj.
  json j = minimal("qwen3");
  j["attention_bias"] = true;
  EXPECT_NE(error_of(j).find("attention_bias: true is not supported for model_type 'qwen3'"),
            std::string::npos);
  j = minimal("qwen3");
  j["use_sliding_window"] = true;
  j["sliding_window"] = 4096;
  EXPECT_EQ(parse_model_config(j, "c.json").sliding_window, 4096);
  // Other families keep hidden_size / heads and have no q/k norms.
  const auto llama = expected_parameters(parse_model_config(minimal("llama"), "c.json"));
  for (const auto& [n, s] : llama) EXPECT_EQ(n.find("q_norm"), std::string::npos) << n;
}

// rms_norm_eps left out of config.json takes transformers' default of the family: Phi3Config's
// 1e-5, every other family's 1e-6; written out on save, so the file reads back the same.
TEST(ModelFamilies, RmsNormEpsDefaultsPerFamily) {
  for (const ModelFamily& f : model_families()) {
    const std::string type(f.model_type);
    const ModelConfig c = parse_model_config(minimal(type), "c.json");
    EXPECT_EQ(c.rms_norm_eps, type == "phi3" ? 1e-5 : 1e-6) << type;
    EXPECT_EQ(model_config_to_json(c).at("rms_norm_eps").get<double>(), c.rms_norm_eps) << type;
  }
  json j = minimal("phi3");
  j["rms_norm_eps"] = 1e-6;  // given: read as given
  EXPECT_EQ(parse_model_config(j, "c.json").rms_norm_eps, 1e-6);
}

// Gemma: the GeGLU gate from `hidden_activation` (its stale `hidden_act: gelu` is kept in the
// file but not read, as transformers does), head_dim 256, tied embeddings, Gemma's token ids.
TEST(ModelFamilies, GemmaReadsHiddenActivationHeadDim256AndTiesByDefault) {
  json j = minimal("gemma");
  j["hidden_act"] = "gelu";
  const ModelConfig c = parse_model_config(j, "c.json");
  EXPECT_EQ(c.hidden_act, kGeluTanh);  // transformers' default when hidden_activation is absent
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 2);
  EXPECT_EQ(c.eos_token_id, 1);
  EXPECT_EQ(c.max_position_embeddings, 8192);
  const json written = model_config_to_json(c);
  EXPECT_EQ(written["hidden_act"], "gelu");  // as read
  EXPECT_EQ(written["hidden_activation"], kGeluTanh);
  EXPECT_TRUE(written["tie_word_embeddings"].get<bool>());
  for (const auto& [n, s] : expected_parameters(c)) EXPECT_NE(n, "lm_head.weight");
  j["hidden_activation"] = "relu";
  const std::string msg = error_of(j);
  EXPECT_NE(msg.find("hidden_activation 'relu' is not supported"), std::string::npos) << msg;
  j["hidden_activation"] = kGeluTanh;
  j["tie_word_embeddings"] = false;
  EXPECT_FALSE(parse_model_config(j, "c.json").tie_word_embeddings);
  // The Llama families read hidden_act and are untied unless told.
  const ModelConfig llama = parse_model_config(minimal("llama"), "c.json");
  EXPECT_EQ(llama.hidden_act, "silu");
  EXPECT_FALSE(llama.tie_word_embeddings);
}

// Gemma 3 (text): transformers' defaults (rope_theta 1e6, the local layers' base 1e4, window
// 4096, five local layers to a global one, no caps), q/k norms; sliding_window_pattern
// overrides the pattern; everything written back.
TEST(ModelFamilies, Gemma3TextReadsTwoRopeBasesAndTheFiveToOnePattern) {
  json j = minimal("gemma3_text");
  j["num_hidden_layers"] = 7;
  const ModelConfig c = parse_model_config(j, "c.json");
  EXPECT_EQ(c.rope_theta, 1000000.0);
  EXPECT_EQ(c.rope_local_base_freq, 10000.0);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.attn_logit_softcapping, 0.0);
  EXPECT_EQ(c.final_logit_softcapping, 0.0);
  EXPECT_EQ(c.query_pre_attn_scalar, 256.0);
  for (int64_t i = 0; i < 7; ++i) EXPECT_EQ(is_sliding_layer(c, i), i != 5) << i;
  int qk = 0;
  for (const auto& [n, s] : expected_parameters(c))
    qk += n.find("self_attn.q_norm") != std::string::npos;
  EXPECT_EQ(qk, 7);
  j["sliding_window_pattern"] = 2;
  j["rope_local_base_freq"] = 500.0;
  const ModelConfig d = parse_model_config(j, "c.json");
  for (int64_t i = 0; i < 7; ++i) EXPECT_EQ(is_sliding_layer(d, i), i % 2 == 0) << i;
  const ModelConfig back = parse_model_config(model_config_to_json(d), "written.json");
  EXPECT_EQ(back.rope_local_base_freq, 500.0);
  EXPECT_EQ(back.layer_types, d.layer_types);
  EXPECT_EQ(back.rope_theta, 1000000.0);
}

// Gemma 2: transformers' defaults for the soft-caps (50, 30), query_pre_attn_scalar (head_dim
// here) and the window (4096) on every other layer from the first; a null cap is none;
// layer_types, when given, decides (and is checked); all of it written back.
TEST(ModelFamilies, Gemma2ReadsSoftcapsQueryScalarAndLocalLayers) {
  json j = minimal("gemma2");
  j["num_hidden_layers"] = 3;
  const ModelConfig c = parse_model_config(j, "c.json");
  EXPECT_EQ(c.attn_logit_softcapping, 50.0);
  EXPECT_EQ(c.final_logit_softcapping, 30.0);
  EXPECT_EQ(c.query_pre_attn_scalar, 256.0);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.layer_types,
            (std::vector<std::string>{"sliding_attention", "full_attention", "sliding_attention"}));
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.hidden_act, kGeluTanh);
  int post_norms = 0;
  for (const auto& [n, s] : expected_parameters(c))
    post_norms += n.find("feedforward_layernorm") != std::string::npos;
  EXPECT_EQ(post_norms, 6);
  j["attn_logit_softcapping"] = nullptr;
  j["final_logit_softcapping"] = 12.5;
  j["query_pre_attn_scalar"] = 144;
  j["sliding_window"] = 16;
  j["layer_types"] = {"full_attention", "sliding_attention", "full_attention"};
  const ModelConfig d = parse_model_config(j, "c.json");
  EXPECT_EQ(d.attn_logit_softcapping, 0.0);
  EXPECT_EQ(d.final_logit_softcapping, 12.5);
  EXPECT_EQ(d.query_pre_attn_scalar, 144.0);
  EXPECT_FALSE(is_sliding_layer(d, 0));
  EXPECT_TRUE(is_sliding_layer(d, 1));
  const ModelConfig back = parse_model_config(model_config_to_json(d), "written.json");
  EXPECT_EQ(back.attn_logit_softcapping, 0.0);
  EXPECT_EQ(back.final_logit_softcapping, 12.5);
  EXPECT_EQ(back.query_pre_attn_scalar, 144.0);
  EXPECT_EQ(back.sliding_window, 16);
  EXPECT_EQ(back.layer_types, d.layer_types);
  j["layer_types"] = {"full_attention", "local", "full_attention"};
  std::string msg = error_of(j);
  EXPECT_NE(msg.find("layer_types entry 'local' is not supported"), std::string::npos) << msg;
  j["layer_types"] = {"full_attention"};
  msg = error_of(j);
  EXPECT_NE(msg.find("one type per layer (3)"), std::string::npos) << msg;
  j.erase("layer_types");
  j["final_logit_softcapping"] = -1;
  msg = error_of(j);
  EXPECT_NE(msg.find("'final_logit_softcapping' must be positive"), std::string::npos) << msg;
}

}  // namespace
}  // namespace fusetune
