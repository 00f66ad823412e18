// ppo_full_finetune_distributed (2 ranks x 1 thread): each rank makes and trains the trajectory
// of its own prompts, seeded by their dataset indices, and everything PPO takes over the batch
// spans the ranks (the whitening, the losses' masked means, the step line). With one PPO
// update per epoch over the whole batch (ppo_batch_size = batch_size), 2 ranks x 2 prompts are
// 1 process x 4 prompts: the same scores, losses, statistics and grad norms within 1e-5 (the
// sums run in another order), over two epochs (the second one's ratios depart from 1). A
// 2-rank checkpoint resumes in one process as the 2-rank run goes on. ZeRO-3 and
// optimizer_in_bwd are refused at validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "cli_runner.h"
#include "files.h"
#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/recipes/recipe_setup.h"
#include "fusetune/tokenizers/load_tokenizer.h"
#include "fusetune/util/fs.h"
#include "metrics_log.h"
#include "mpi_runs.h"
#include "recipe_runs.h"
#include "test_support.h"
#include "tiny_llama.h"
#include "token_reward_model.h"

using namespace fusetune;
using namespace fusetune::testing;
namespace fs = std::filesystem;

namespace {

// The tiny policy, its value and reward models, 16 prompts and the config (4 prompts a step in
// all: batch_size is set per run).
fs::path write_dist_ppo_config(const fs::path& dir) {
  const fs::path policy = write_tiny_checkpoint(dir);
  const int32_t e = load_tokenizer("byte", "")->encode("e", false, false).at(0);
  const fs::path value = write_classifier_checkpoint(policy, dir / "value", 5);
  const fs::path reward = write_classifier_checkpoint(
      policy, dir / "reward", 5, 1, [e](LoadedModel& m) { make_token_reward(m, e, 0.5); });
  std::string text;
  const char* starts[] = {"Once upon a time", "The cat sat", "A dog ran", "She said"};
  for (int i = 0; i < 16; ++i)
    text += std::string(starts[i % 4]) + " " + std::to_string(i) + "\n\n";
  write_file_atomic(dir / "prompts.txt", text);
  std::ostringstream s;
  s << tiny_ppo_models_yaml(policy, value, reward, false)
    << "dataset:\n  _component_: text_completion\n  source: " << (dir / "prompts.txt").string()
    << "\n  add_eos: false\n"
    << "seed: 3\nshuffle: true\nnum_steps: 12\nppo_epochs: 2\ngradient_accumulation_steps: 1\n"
    << "max_generated_tokens: 4\ntemperature: 1.0\nkl_coeff: 0.05\n"
    << "loss:\n  _component_: PPOLoss\n  epsilon: 0.2\n  value_coeff: 0.1\n"
    << "  value_clip_range: 0.2\n"
    << "optimizer:\n  _component_: AdamW\n  lr: 1e-3\n  weight_decay: 0.0\n"
    << "clip_grad_norm: 100.0\n"
    << "compile: false\nnum_threads: 1\nlog_every_n_steps: 1\nlog_peak_memory_stats: false\n";
  const fs::path config = dir / "ppo.yaml";
  write_file_atomic(config, s.str());
  return config;
}

// `rows` prompts per process and step, all in one PPO update per epoch.
Overrides dist_ppo_rows(const fs::path& out, int rows, const Overrides& extra = {}) {
  Overrides o{{"output_dir", out.string()},
              {"batch_size", std::to_string(rows)},
              {"ppo_batch_size", std::to_string(rows)},
              {"forward_batch_size", std::to_string(rows)}};
  for (const auto& [k, v] : extra) o[k] = v;
  return o;
}

// The step line's PPO values that must not depend on the rank count.
const char* const kDistPpoKeys[] = {
    "scores",      "rlhf_reward", "kl",     "response_lengths", "num_stop_tokens", "loss",
    "policy_loss", "value_loss",  "ratios", "clipfrac",         "grad_norm"};

// |a - b| <= 1e-5 max(1, |b|) for every logged step of every key.
void expect_same_ppo_steps(const fs::path& got, const fs::path& want, size_t from = 0) {
  for (const char* key : kDistPpoKeys) {
    const std::vector<double> a = logged_values(got, key), b = logged_values(want, key);
    ASSERT_FALSE(a.empty()) << key << " is not logged";
    ASSERT_EQ(a.size() + from, b.size()) << key;
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_NEAR(a[i], b[i + from], 1e-5 * std::max(1.0, std::abs(b[i + from])))
          << key << " at logged step " << i + from + 1;
  }
}

}  // namespace

TEST(DistPpo, TwoRanksTrainAsOneProcessAndResumeOnOneProcess) {
  FT_REQUIRE_MPIRUN();
  const TempDir tmp;
  const fs::path config = write_dist_ppo_config(tmp.path());
  const fs::path one = tmp.path() / "one", two = tmp.path() / "two";
  run_ok(run_command("ppo_full_finetune_single_device", config.string(), dist_ppo_rows(one, 4)),
         tmp.path() / "s_one");
  ASSERT_EQ(logged_values(one, "scores").size(), 3u) << "num_steps 12 // 4 prompts a step";
  EXPECT_GT(logged_values(one, "ratios")[0], 0.0);
  run_ok(mpirun_command(2, "ppo_full_finetune_distributed", config.string(),
                        dist_ppo_rows(two, 2, {{"save_every_n_steps", "1"}})),
         tmp.path() / "s_two");
  expect_same_ppo_steps(two, one);
  // The second epoch trains on moved weights: its ratios depart from 1 on both.
  EXPECT_NE(logged_values(two, "ratios")[0], 1.0);
  // The 2-rank run's step-2 checkpoint, resumed by one process x 4 prompts: step 3 as there.
  const fs::path resumed = tmp.path() / "resumed";
  fs::create_directories(resumed);
  fs::copy(two / "step_2", resumed / "step_2", fs::copy_options::recursive);
  run_ok(run_command("ppo_full_finetune_single_device", config.string(),
                     dist_ppo_rows(resumed, 4, {{"resume_from_checkpoint", "true"}})),
         tmp.path() / "s_resumed");
  const std::vector<LoggedStep> got = logged_steps(resumed);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].step, 3);
  expect_same_ppo_steps(resumed, two, 2);
}

// ZeRO-1 (the optimizer state sharded) and ZeRO-2 (each PPO update's gradients reduced into
// their owners) give the same steps as the one-process run.
TEST(DistPpo, ZeroStagesOneAndTwoTrainAsOneProcess) {
  FT_REQUIRE_MPIRUN();
  const TempDir tmp;
  const fs::path config = write_dist_ppo_config(tmp.path());
  const fs::path one = tmp.path() / "one";
  run_ok(run_command("ppo_full_finetune_single_device", config.string(),
                     dist_ppo_rows(one, 4, {{"num_steps", "8"}})),
         tmp.path() / "s_one");
  for (const char* stage : {"1", "2"}) {
    const fs::path out = tmp.path() / (std::string("zero") + stage);
    run_ok(mpirun_command(2, "ppo_full_finetune_distributed", config.string(),
                          dist_ppo_rows(out, 2, {{"num_steps", "8"}, {"zero_stage", stage}})),
           tmp.path() / (std::string("s_zero") + stage));
    SCOPED_TRACE(std::string("zero_stage ") + stage);
    expect_same_ppo_steps(out, one);
  }
}

// Sharded parameters (no whole weights to generate on) and optimizer_in_bwd (it would update
// with one rank's gradient) are refused before anything runs.
TEST(PpoDistributedConfig, RefusesZeroStage3AndOptimizerInBwd) {
  const TempDir tmp;
  const fs::path config = write_dist_ppo_config(tmp.path());
  const std::string validate =
      "validate " + config.string() +
      " --recipe ppo_full_finetune_distributed batch_size=2 ppo_batch_size=2 "
      "forward_batch_size=2 output_dir=/tmp/unused ";
  auto r = run_fusetune(validate + "zero_stage=3");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("zero_stage 3 shards the parameters"), std::string::npos) << r.out;
  r = run_fusetune(validate + "optimizer_in_bwd=true");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("optimizer_in_bwd: true would update each parameter"), std::string::npos)
      << r.out;
  r = run_fusetune(validate + "zero_stage=2");
  EXPECT_EQ(r.code, 0) << r.out;
}
