// PPO on a real pretrained policy (docs/ppo.md): the built-in config stories260K/ppo_single_device
// with stories260K as policy and reference, stories260K with a fresh score head as the value
// model, and a hand-made reward model from stories260K whose score is how close each
// response's last token is to " happy" (its layers' outputs zeroed, the score head along that
// token's embedding). Over a few dozen steps PPO raises the mean score well beyond the spread
// of the first steps; fixed seed, one thread.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "fusetune/cli/command.h"
#include "fusetune/config/builtin_configs.h"
#include "fusetune/config/config.h"
#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/recipes/recipe_setup.h"
#include "fusetune/tokenizers/load_tokenizer.h"
#include "fusetune/util/fs.h"
#include "metrics_log.h"
#include "test_support.h"
#include "token_reward_model.h"

using namespace fusetune;
using namespace fusetune::testing;
namespace fs = std::filesystem;

TEST(Stories260KPpo, RaisesAHandMadeRewardModelsScore) {
  FT_REQUIRE_ASSET("stories260K/model.safetensors");
  FT_REQUIRE_ASSET("datasets/tinystories_197k.txt");
  const fs::path assets = assets_dir();
  TempDir tmp;
  const std::string tok_path = (assets / "stories260K/tokenizer.json").string();
  const auto tok = load_tokenizer("hf", tok_path);
  const int32_t happy = tok->encode(" happy", false, false).back();
  write_classifier_checkpoint(assets / "stories260K", tmp / "value", 7);
  write_classifier_checkpoint(assets / "stories260K", tmp / "reward", 7, 1,
                              [happy](LoadedModel& m) { make_token_reward(m, happy, 0.25); });
  Config c = load_config("stories260K/ppo_single_device");
  const std::string model = (assets / "stories260K").string();
  c.apply_overrides({"output_dir=" + (tmp / "run").string(), "tokenizer.path=" + tok_path,
                     "checkpointer.checkpoint_dir=" + model,
                     "ref_policy_checkpointer.checkpoint_dir=" + model,
                     "value_checkpointer.checkpoint_dir=" + (tmp / "value").string(),
                     "reward_checkpointer.checkpoint_dir=" + (tmp / "reward").string(),
                     "dataset.source=" + (assets / "datasets/tinystories_197k.txt").string(),
                     "num_steps=480", "max_generated_tokens=6", "min_response_length=null",
                     "optimizer.lr=1e-3", "num_threads=1", "log_peak_memory_stats=false"});
  write_file_atomic(tmp / "ppo.yaml", c.to_yaml());
  ASSERT_EQ(
      cli::cmd_run({"ppo_full_finetune_single_device", "--config", (tmp / "ppo.yaml").string()}),
      0);
  const std::vector<double> s = logged_values(tmp / "run", "scores");
  ASSERT_EQ(s.size(), 30u);
  double first = 0, last = 0, lo = 1e9, hi = -1e9;
  for (size_t i = 0; i < 5; ++i) {
    first += s[i] / 5;
    last += s[s.size() - 1 - i] / 5;
    lo = std::min(lo, s[i]);
    hi = std::max(hi, s[i]);
  }
  std::printf("stories260K PPO: score, first 5 steps %.3f (%.3f .. %.3f), last 5 %.3f\n", first, lo,
              hi, last);
  EXPECT_GT(last - first, 2 * (hi - lo));
  EXPECT_TRUE(fs::exists(tmp / "run" / "epoch_0" / "value" / "config.json"));
}
