// GRPO that learns: the built-in stories260K/grpo_single_device (stories260K, prompts from
// TinyStories paragraphs, the verifiable reward "the completion uses the word happy") with a
// fixed seed raises the mean reward of the rollouts, over 20 steps, well beyond the first
// step's reward and its spread (from about 0 to about 1).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "fusetune/cli/command.h"
#include "metrics_log.h"
#include "test_support.h"

using namespace fusetune;
using namespace fusetune::testing;
namespace fs = std::filesystem;

TEST(Stories260KGrpo, TargetWordRewardRisesWellBeyondItsFirstSteps) {
  FT_REQUIRE_ASSET("stories260K/model.safetensors");
  FT_REQUIRE_ASSET("datasets/tinystories_197k.txt");
  TempDir tmp;
  const std::string a = assets_dir().string();
  const fs::path out = tmp / "run";
  ASSERT_EQ(cli::cmd_run({"grpo_full_finetune_single_device", "--config",
                          "stories260K/grpo_single_device", "output_dir=" + out.string(),
                          "tokenizer.path=" + a + "/stories260K/tokenizer.json",
                          "dataset.source=" + a + "/datasets/tinystories_197k.txt",
                          "checkpointer.checkpoint_dir=" + a + "/stories260K", "num_threads=1"}),
            0);
  const std::vector<double> reward = logged_values(out, "reward");
  const std::vector<double> spread = logged_values(out, "reward_std");
  ASSERT_EQ(reward.size(), 20u);
  // The last 5 steps' mean against step 1's mean and the spread of its groups (each step: 8
  // completions of each of 4 prompts).
  double last = 0;
  for (size_t i = 15; i < 20; ++i) last += reward[i] / 5.0;
  EXPECT_GT(last, reward[0] + 3.0 * std::max(spread[0], 0.05))
      << "step 1: reward " << reward[0] << ", spread " << spread[0] << "; last 5 steps: " << last;
  EXPECT_GT(last, 0.5);
}
