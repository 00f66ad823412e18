// What the full fine-tune saves: epoch_0 is a Hugging Face directory that loads back (HF
// tensor names, config.json), its recipe state is consistent with it, and a new run started
// from it continues at the loss where the first run ended.
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/recipes/training_checkpoint.h"
#include "recipe_runs.h"
#include "test_support.h"

namespace fs = std::filesystem;
using fusetune::testing::CliRun;
using fusetune::testing::demo_command;
using fusetune::testing::logged_steps;
using fusetune::testing::read_text;
using fusetune::testing::run_shell;
using fusetune::testing::TempDir;

TEST(RecipeCheckpoint, EpochDirectoryRoundTrip) {
  TempDir tmp;
  const fs::path out = tmp / "first";
  CliRun r = run_shell(demo_command(out, {{"max_steps_per_epoch", "10"}}), tmp / "io1");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto first = logged_steps(out);
  ASSERT_EQ(first.size(), 10u);
  const fs::path ck = out / "epoch_0";
  for (const char* f :
       {"config.json", "model.safetensors", "recipe_state.json", "recipe_state.safetensors"})
    EXPECT_TRUE(fs::is_regular_file(ck / f)) << f;

  // config.json describes the demo model; the tensors carry HF names and load back.
  const nlohmann::json cj = nlohmann::json::parse(read_text(ck / "config.json"));
  EXPECT_EQ(cj.at("model_type"), "llama");
  EXPECT_EQ(cj.at("vocab_size"), 259);
  EXPECT_EQ(cj.at("hidden_size"), 64);
  EXPECT_EQ(cj.at("num_hidden_layers"), 2);
  EXPECT_EQ(cj.at("num_key_value_heads"), 2);
  fusetune::HFCheckpoint loaded = fusetune::load_hf_checkpoint(ck);
  std::set<std::string> names;
  for (const auto& [name, t] : loaded.tensors) names.insert(name);
  std::set<std::string> want;
  for (const auto& [name, shape] : fusetune::expected_parameters(loaded.config)) want.insert(name);
  EXPECT_EQ(names, want);
  for (const char* n :
       {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
        "model.layers.1.mlp.down_proj.weight", "model.norm.weight", "lm_head.weight"})
    EXPECT_TRUE(names.count(n)) << n;
  EXPECT_EQ(loaded.tensors.at("model.layers.0.self_attn.k_proj.weight").shape(),
            (fusetune::Shape{32, 64}));

  // The resumable state agrees with the HF files: same weights, AdamW moments, where it stands.
  fusetune::ResumedState state = fusetune::load_training_checkpoint(ck, fusetune::DType::F32);
  EXPECT_EQ(state.progress.epoch, 1);
  EXPECT_EQ(state.progress.step_in_epoch, 0);
  EXPECT_EQ(state.progress.global_step, 10);
  EXPECT_FALSE(state.optimizer.empty());
  for (const auto& [name, t] : loaded.tensors) {
    const fusetune::Tensor& s = state.params.at(name);
    ASSERT_EQ(s.numel(), t.numel()) << name;
    EXPECT_EQ(0, std::memcmp(s.data<float>(), t.data<float>(), size_t(t.numel()) * sizeof(float)))
        << name;
  }

  // A new run from epoch_0, on the same first batch (same seed): its first loss is where the
  // first run ended, far below where that one began.
  const fs::path second = tmp / "second";
  r = run_shell(demo_command(second, {{"max_steps_per_epoch", "3"},
                                      {"~model", ""},
                                      {"model.init", "checkpoint"},
                                      {"checkpointer.checkpoint_dir", ck.string()}}),
                tmp / "io2");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto next = logged_steps(second);
  ASSERT_EQ(next.size(), 3u);
  EXPECT_LT(next[0].loss, first[0].loss - 1.0);
  EXPECT_NEAR(next[0].loss, first.back().loss, 0.25 * first.back().loss)
      << "first run: " << first[0].loss << " .. " << first.back().loss;
  // Its own epoch_0 is again a loadable HF directory with the same architecture.
  fusetune::HFCheckpoint again = fusetune::load_hf_checkpoint(second / "epoch_0");
  EXPECT_EQ(again.tensors.size(), loaded.tensors.size());
}
