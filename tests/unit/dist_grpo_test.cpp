// The distributed GRPO recipes (2 ranks x 1 thread): each rank generates, scores and trains its
// own prompts. A prompt's completions are seeded by its dataset index, so 2 ranks x 1 prompt
// sample what one process x 2 prompts does: the same rewards, and grad norms within the
// equivalence tests' 1e-5 (the gradient is summed over the ranks instead of in one backward).
// Reruns are bitwise; a 2-rank checkpoint resumes in one process as the 2-rank run goes on.
// ZeRO-3 (sharded parameters, on which no rollout can generate) is refused at validation.
#include <gtest/gtest.h>

#include <sstream>

#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "files.h"
#include "metrics_log.h"
#include "mpi_runs.h"
#include "recipe_runs.h"
#include "test_support.h"
#include "tiny_llama.h"

using namespace fusetune::testing;
namespace fs = std::filesystem;

namespace {

// Eight problems whose prompts have the same length (no left-padding differs between batches).
fs::path write_problems(const fs::path& dir) {
  std::string rows;
  for (int i = 0; i < 8; ++i)
    rows += nlohmann::json({{"question", "What is " + std::to_string(i) + " plus 2?"},
                            {"answer", "#### " + std::to_string(i + 2)}})
                .dump() +
            "\n";
  const fs::path p = dir / "problems.jsonl";
  write_text(p, rows);
  return p;
}

std::string dist_grpo_yaml(const fs::path& problems) {
  std::ostringstream s;
  s << tiny_model_yaml(128) << "tokenizer:\n  _component_: byte\n"
    << "dataset:\n  _component_: gsm8k\n  source: " << problems.string()
    << "\n  prompt_template: \"Q {question} A\"\n"
    << "seed: 3\nshuffle: true\nepochs: 1\nmax_steps_per_epoch: 3\n"
    << "grpo_samples: 4\nmax_generated_tokens: 6\ntemperature: 1.0\n"
    << "rewards:\n  external: {command: \"awk '{print gsub(/e/, \\\"e\\\")}'\"}\n"
    << "optimizer:\n  _component_: AdamW\n  lr: 1e-2\n  weight_decay: 0.0\n"
    << "loss:\n  _component_: GRPOLoss\n  loss_type: grpo\n  beta: 0.0\n"
    << "compile: false\nnum_threads: 1\nlog_every_n_steps: 1\nlog_peak_memory_stats: false\n";
  return s.str();
}

std::vector<double> grad_norms(const fs::path& out) {
  std::vector<double> g;
  for (const LoggedStep& s : logged_steps(out)) g.push_back(s.grad_norm);
  return g;
}

}  // namespace

TEST(DistGrpo, TwoRanksSampleAndTrainAsOneProcessRerunBitwiseAndResumeOnOneRank) {
  FT_REQUIRE_MPIRUN();
  const TempDir tmp;
  const fs::path config = tmp.path() / "grpo.yaml";
  write_text(config, dist_grpo_yaml(write_problems(tmp.path())));
  const fs::path ref = tmp.path() / "one";
  run_ok(run_command("grpo_full_finetune_single_device", config.string(),
                     {{"output_dir", ref.string()}, {"batch_size", "2"}}),
         tmp.path() / "s_one");
  Overrides two{{"output_dir", (tmp.path() / "two").string()},
                {"batch_size", "1"},
                {"zero_stage", "2"},
                {"save_every_n_steps", "1"}};
  run_ok(mpirun_command(2, "grpo_full_finetune_distributed", config.string(), two),
         tmp.path() / "s_two");
  const std::vector<double> reward = logged_values(ref, "reward");
  ASSERT_EQ(reward.size(), 3u);
  EXPECT_EQ(logged_values(tmp.path() / "two", "reward"), reward) << "the same completions";
  EXPECT_GT(logged_values(ref, "reward_std")[0], 0.0) << "the groups' rewards should differ";
  expect_same_curve(grad_norms(tmp.path() / "two"), grad_norms(ref), "grad norm, 2 x 1 vs 1 x 2");
  // A rerun, bitwise.
  two["output_dir"] = (tmp.path() / "again").string();
  run_ok(mpirun_command(2, "grpo_full_finetune_distributed", config.string(), two),
         tmp.path() / "s_again");
  EXPECT_EQ(losses_of(logged_steps(tmp.path() / "again")),
            losses_of(logged_steps(tmp.path() / "two")));
  EXPECT_EQ(grad_norms(tmp.path() / "again"), grad_norms(tmp.path() / "two"));
  // The 2-rank run's step-2 checkpoint, resumed by one process x 2 prompts: step 3 as there.
  const fs::path resumed = tmp.path() / "resumed";
  fs::create_directories(resumed);
  fs::copy(tmp.path() / "two" / "step_2", resumed / "step_2", fs::copy_options::recursive);
  run_ok(run_command("grpo_full_finetune_single_device", config.string(),
                     {{"output_dir", resumed.string()},
                      {"batch_size", "2"},
                      {"resume_from_checkpoint", "true"}}),
         tmp.path() / "s_resumed");
  const std::vector<LoggedStep> got = logged_steps(resumed);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].step, 3);
  EXPECT_EQ(logged_values(resumed, "reward")[0], reward[2]);
  expect_same_curve({got[0].grad_norm}, {grad_norms(tmp.path() / "two")[2]}, "resumed step 3");
  // Sharded parameters: refused before anything runs.
  const auto r =
      run_fusetune("validate " + config.string() +
                   " --recipe grpo_full_finetune_distributed zero_stage=3 output_dir=/tmp/unused");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("zero_stage 3 shards the parameters"), std::string::npos) << r.out;
}
