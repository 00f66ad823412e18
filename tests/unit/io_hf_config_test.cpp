// io/hf_config: config.json -> ModelConfig with transformers' defaults, and clear errors.
#include "fusetune/io/hf_config.h"

#include <string>

#include <gtest/gtest.h>

#include "fusetune/util/error.h"
#include "fusetune/util/fs.h"
#include "test_support.h"

using fusetune::testing::TempDir;
using nlohmann::json;

namespace fusetune {
namespace {

json llama() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 172, "num_hidden_layers": 5, "num_attention_heads": 8,
    "num_key_value_heads": 4, "vocab_size": 512, "max_position_embeddings": 512,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": true,
    "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32", "custom_key": [1, 2]})");
}

// Expects parsing to fail with a one-line message containing every needle.
void expect_error(const json& j, std::initializer_list<std::string> needles) {
  try {
    parse_model_config(j, "my/config.json");
    ADD_FAILURE() << "expected an error for " << j.dump();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_NE(msg.find("my/config.json"), std::string::npos) << msg;
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << msg;
  }
}

TEST(IoHfConfig, ParsesLlamaWithDefaults) {
  json j = llama();
  j.erase("num_key_value_heads");
  j.erase("rope_theta");
  j.erase("bos_token_id");
  ModelConfig c = parse_model_config(j);
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_key_value_heads, 8);  // defaults to num_attention_heads
  EXPECT_EQ(c.head_dim, 8);             // hidden / heads
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.bos_token_id, 1);  // LlamaConfig default
  EXPECT_EQ(c.eos_token_id, 2);
  EXPECT_TRUE(c.rope_scaling.rope_type.empty());
  EXPECT_EQ(c.raw["custom_key"], json::parse("[1, 2]"));
}

TEST(IoHfConfig, ExplicitHeadDimAndEosList) {
  json j = llama();
  j["head_dim"] = 16;  // need not be hidden / heads when given
  j["eos_token_id"] = {128001, 128008, 128009};
  ModelConfig c = parse_model_config(j);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.eos_token_id, 128001);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  json back = model_config_to_json(c);
  EXPECT_EQ(back["eos_token_id"], json::parse("[128001, 128008, 128009]"));
  EXPECT_EQ(back["head_dim"], 16);
}

TEST(IoHfConfig, Qwen2HasQkvBiasAndSlidingWindowIsStored) {
  json q = json::parse(R"({"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "vocab_size": 100, "use_sliding_window": false, "sliding_window": 4096,
    "eos_token_id": 99})");
  ModelConfig c = parse_model_config(q);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_EQ(c.sliding_window, 0);  // not in use
  EXPECT_EQ(c.max_position_embeddings, 32768);
  EXPECT_EQ(c.bos_token_id, -1);

  json m = llama();
  m["model_type"] = "mistral";
  m["sliding_window"] = 4096;
  m.erase("max_position_embeddings");
  ModelConfig mc = parse_model_config(m);
  EXPECT_EQ(mc.sliding_window, 4096);
  EXPECT_EQ(mc.max_position_embeddings, 131072);
  m["sliding_window"] = nullptr;
  EXPECT_EQ(parse_model_config(m).sliding_window, 0);
}

TEST(IoHfConfig, RopeScaling) {
  json j = llama();
  j["rope_scaling"] = nullptr;
  EXPECT_TRUE(parse_model_config(j).rope_scaling.rope_type.empty());

  j["rope_scaling"] = json::parse(R"({"rope_type": "llama3", "factor": 8.0,
    "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})");
  ModelConfig c = parse_model_config(j);
  EXPECT_EQ(c.rope_scaling.rope_type, "llama3");
  EXPECT_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);

  j["rope_scaling"] = json::parse(R"({"type": "linear", "factor": 2.0})");  // legacy key
  c = parse_model_config(j);
  EXPECT_EQ(c.rope_scaling.rope_type, "linear");
  EXPECT_EQ(c.rope_scaling.factor, 2.0);

  j["rope_scaling"] = json::parse(R"({"rope_type": "yarn", "factor": 4.0})");
  expect_error(j, {"rope_scaling type 'yarn' is not supported", "llama3, linear"});
  j["rope_scaling"] = json::parse(R"({"rope_type": "llama3", "factor": 8.0})");
  expect_error(j, {"llama3", "low_freq_factor"});
  j["rope_scaling"] = json::parse(R"({"factor": 8.0})");
  expect_error(j, {"rope_type"});
}

TEST(IoHfConfig, BadConfigsNameTheKey) {
  json j = llama();
  j.erase("hidden_size");
  expect_error(j, {"missing required key 'hidden_size'"});

  j = llama();
  j["model_type"] = "lama";
  expect_error(j, {"model_type 'lama' is not supported", "did you mean 'llama'"});
  j["model_type"] = "gpt2";
  expect_error(j, {"model_type 'gpt2'", "llama, mistral, qwen2"});
  j.erase("model_type");
  expect_error(j, {"model_type"});

  j = llama();
  j["num_attention_heads"] = 7;
  j.erase("num_key_value_heads");
  expect_error(j, {"num_attention_heads (7) must divide hidden_size (64)"});

  j = llama();
  j["num_key_value_heads"] = 3;
  expect_error(j, {"num_key_value_heads (3) must divide num_attention_heads (8)"});

  j = llama();
  j["num_hidden_layers"] = 0;
  expect_error(j, {"'num_hidden_layers' must be positive"});

  j = llama();
  j["vocab_size"] = "512";
  expect_error(j, {"'vocab_size' must be an integer"});
  j["vocab_size"] = 512.5;
  expect_error(j, {"'vocab_size' must be an integer"});

  j = llama();
  j["hidden_act"] = "gelu";
  expect_error(j, {"hidden_act 'gelu'"});

  j = llama();
  j["attention_bias"] = true;  // HF llama would add an o_proj bias we do not model
  expect_error(j, {"attention_bias"});

  expect_error(json::array({1}), {"expected a JSON object"});

  // A qwen2 config built in code without biases could not round-trip through config.json.
  json q = llama();
  q["model_type"] = "qwen2";
  ModelConfig qc = parse_model_config(q);
  qc.attention_bias = false;
  EXPECT_THROW(validate_model_config(qc), Error);
}

TEST(IoHfConfig, ToJsonRoundTripsAndKeepsUnknownKeys) {
  json j = llama();
  j["rope_scaling"] = json::parse(R"({"rope_type": "llama3", "factor": 8.0,
    "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})");
  ModelConfig c = parse_model_config(j);
  c.num_hidden_layers = 3;  // our field wins over raw
  json out = model_config_to_json(c);
  EXPECT_EQ(out["num_hidden_layers"], 3);
  EXPECT_EQ(out["custom_key"], json::parse("[1, 2]"));
  ModelConfig again = parse_model_config(out);
  EXPECT_EQ(again.num_hidden_layers, 3);
  EXPECT_EQ(again.num_key_value_heads, c.num_key_value_heads);
  EXPECT_EQ(again.head_dim, c.head_dim);
  EXPECT_EQ(again.rope_scaling.rope_type, "llama3");
  EXPECT_EQ(again.rope_scaling.factor, 8.0);
  EXPECT_EQ(again.tie_word_embeddings, true);
  EXPECT_EQ(again.eos_token_id, 2);

  // A config built in code (no raw) gets architectures and parses back.
  ModelConfig fresh;
  fresh.model_type = "qwen2";
  fresh.vocab_size = 10;
  fresh.hidden_size = 8;
  fresh.intermediate_size = 16;
  fresh.num_hidden_layers = 1;
  fresh.num_attention_heads = 2;
  fresh.num_key_value_heads = 1;
  fresh.head_dim = 4;
  fresh.attention_bias = true;
  json fj = model_config_to_json(fresh);
  EXPECT_EQ(fj["architectures"][0], "Qwen2ForCausalLM");
  ModelConfig fb = parse_model_config(fj);
  EXPECT_TRUE(fb.attention_bias);
  EXPECT_EQ(fb.head_dim, 4);
  EXPECT_EQ(fb.num_key_value_heads, 1);
}

TEST(IoHfConfig, LoadFromDirectoryOrFile) {
  TempDir tmp;
  write_file_atomic(tmp / "config.json", llama().dump());
  EXPECT_EQ(load_model_config(tmp.path()).num_hidden_layers, 5);
  EXPECT_EQ(load_model_config(tmp / "config.json").num_hidden_layers, 5);
  write_file_atomic(tmp / "broken.json", "{\"model_type\": ");
  try {
    load_model_config(tmp / "broken.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("broken.json"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_model_config(tmp / "sub"), Error);
}

}  // namespace
}  // namespace fusetune
