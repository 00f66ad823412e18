// Loads the real stories260K checkpoint (HF layout, tied embeddings, GQA) through
// load_hf_checkpoint and checks names, shapes and values read independently from the file.
#include <gtest/gtest.h>

#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/io/hf_config.h"
#include "test_support.h"

namespace fusetune {
namespace {

TEST(IoStories260K, LoadsConfigAndTensors) {
  FT_REQUIRE_ASSET("stories260K/model.safetensors");
  const auto dir = ::fusetune::testing::assets_dir() / "stories260K";
  HFCheckpoint ck = load_hf_checkpoint(dir);
  const ModelConfig& c = ck.config;
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_hidden_layers, 5);
  EXPECT_EQ(c.num_attention_heads, 8);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);

  // 1 embedding + 5 layers x 9 + final norm; tied, so no lm_head.
  ASSERT_EQ(ck.tensors.size(), 47u);
  EXPECT_FALSE(ck.tensors.count("lm_head.weight"));
  for (const auto& [name, shape] : expected_parameters(c)) {
    ASSERT_TRUE(ck.tensors.count(name)) << name;
    EXPECT_EQ(ck.tensors.at(name).shape(), shape) << name;
    EXPECT_EQ(ck.tensors.at(name).dtype(), DType::F32) << name;
  }
  EXPECT_EQ(ck.tensors.at("model.layers.0.self_attn.k_proj.weight").shape(), (Shape{32, 64}));
  EXPECT_EQ(ck.tensors.at("model.layers.0.mlp.down_proj.weight").shape(), (Shape{64, 172}));

  // Values read from the file with Python's struct module (independent of our reader).
  const auto& emb = ck.tensors.at("model.embed_tokens.weight");
  EXPECT_FLOAT_EQ(emb.data<float>()[0], -0.29474878311157227f);
  EXPECT_FLOAT_EQ(emb.data<float>()[64 * 300 + 5], -0.22775627672672272f);
  EXPECT_FLOAT_EQ(ck.tensors.at("model.norm.weight").data<float>()[0], 2.4583089351654053f);
  EXPECT_FLOAT_EQ(ck.tensors.at("model.layers.4.mlp.down_proj.weight").data<float>()[64 * 172 - 1],
                  -0.0035068716388195753f);
  EXPECT_FLOAT_EQ(ck.tensors.at("model.layers.2.self_attn.k_proj.weight").data<float>()[100],
                  0.3714529275894165f);
}

TEST(IoStories260K, SaveAsBf16ShardedAndReload) {
  FT_REQUIRE_ASSET("stories260K/model.safetensors");
  const auto dir = ::fusetune::testing::assets_dir() / "stories260K";
  HFCheckpoint ck = load_hf_checkpoint(dir);
  NamedTensors tensors;
  for (const auto& [name, shape] : expected_parameters(ck.config))
    tensors.push_back({name, ck.tensors.at(name)});
  ::fusetune::testing::TempDir tmp;
  SaveOptions opt;
  opt.dtype = DType::BF16;
  opt.max_shard_bytes = 200 * 1024;
  opt.copy_files_from = dir;
  save_hf_checkpoint(tmp / "out", ck.config, tensors, opt);
  EXPECT_TRUE(std::filesystem::exists(tmp / "out" / "model.safetensors.index.json"));
  EXPECT_TRUE(std::filesystem::exists(tmp / "out" / "tokenizer.json"));
  HFCheckpoint back = load_hf_checkpoint(tmp / "out");
  EXPECT_EQ(model_config_to_json(back.config)["rms_norm_eps"], 1e-5);
  for (const auto& [name, t] : tensors) {
    const Tensor& b = back.tensors.at(name);
    for (int64_t i = 0; i < t.numel(); ++i)
      ASSERT_EQ(b.data<float>()[i], bf16_to_f32(f32_to_bf16(t.data<float>()[i]))) << name;
  }
}

}  // namespace
}  // namespace fusetune
