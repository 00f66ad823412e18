// The DPO recipes without assets: a random-init model with the byte tokenizer on preference
// pairs written here. The first step's loss is log 2 (policy = reference), QLoRA (NF4 base
// and head) runs in every compile mode with the same losses, and `fusetune plan` builds the
// recipe's own step (the fused log-prob kernels under compile: true, the reference pass).
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fusetune/cli/command.h"
#include "fusetune/util/fs.h"
#include "metrics_log.h"
#include "test_support.h"
#include "tiny_llama.h"

using namespace fusetune;
using namespace fusetune::testing;
namespace fs = std::filesystem;

namespace {

std::string dpo_yaml(const fs::path& out, const fs::path& data) {
  std::ostringstream s;
  s << "output_dir: " << out.string() << "\n"
    << tiny_model_yaml(128) << tiny_dpo_lora_yaml()
    << "tokenizer:\n  _component_: byte\n  max_seq_len: 64\n"
    << "dataset:\n  _component_: preference\n  source: " << data.string() << "\n"
    << "seed: 1\nshuffle: true\nbatch_size: 2\nepochs: 2\n"
    << "optimizer:\n  _component_: AdamW\n  lr: 1e-2\n  weight_decay: 0.0\n"
    << "loss:\n  _component_: DPOLoss\n  beta: 0.1\ncompile: false\nnum_threads: 1\n"
    << "log_every_n_steps: 1\nlog_peak_memory_stats: false\n";
  return s.str();
}

void write_pairs(const fs::path& p, int n) {
  nlohmann::json rows = nlohmann::json::array();
  for (int i = 0; i < n; ++i)
    rows.push_back({{"prompt", "Name a color " + std::to_string(i) + "."},
                    {"chosen", i % 2 ? "Blue, like the sky." : "Green."},
                    {"rejected", i % 2 ? "I will not." : "Seven is a number."}});
  write_file_atomic(p, rows.dump());
}

}  // namespace

TEST(DpoRecipe, QloraDpoStartsAtLog2AndCompileModesAgree) {
  TempDir tmp;
  write_pairs(tmp / "pairs.json", 8);
  write_file_atomic(tmp / "cfg.yaml", dpo_yaml(tmp / "run", tmp / "pairs.json"));
  std::vector<double> by_mode[3];
  int m = 0;
  for (const char* mode : {"false", "model", "true"}) {
    const fs::path out = tmp / (std::string("run_") + mode);
    ASSERT_EQ(cli::cmd_run({"lora_dpo_single_device", "--config", (tmp / "cfg.yaml").string(),
                            std::string("compile=") + mode, "model.quantize_base=true",
                            "output_dir=" + out.string()}),
              0);
    by_mode[m++] = logged_values(out, "loss");
    EXPECT_TRUE(fs::exists(out / "epoch_1" / "adapter_model.safetensors"));
  }
  ASSERT_EQ(by_mode[0].size(), 8u);
  EXPECT_NEAR(by_mode[0][0], std::log(2.0), 1e-6);
  for (int k = 1; k < 3; ++k)
    for (size_t i = 0; i < by_mode[0].size(); ++i)
      EXPECT_NEAR(by_mode[k][i], by_mode[0][i], 1e-4 * std::max(1.0, std::abs(by_mode[0][i])))
          << "mode " << k << " step " << i + 1;
}

// dtype: bf16. The per-sequence log-probs and the preference arithmetic stay fp32 (a
// sequence's log-prob is ~-1000: bf16's step there is 4, which made policy - reference
// noise and the first loss 0.674 instead of log 2 before they did). The curve follows fp32's.
TEST(DpoRecipe, Bf16DpoStartsAtLog2AndFollowsFp32) {
  TempDir tmp;
  write_pairs(tmp / "pairs.json", 8);
  write_file_atomic(tmp / "cfg.yaml", dpo_yaml(tmp / "run", tmp / "pairs.json"));
  std::vector<double> by_dtype[2];
  int k = 0;
  for (const char* dtype : {"fp32", "bf16"}) {
    const fs::path out = tmp / (std::string("run_") + dtype);
    ASSERT_EQ(
        cli::cmd_run({"lora_dpo_single_device", "--config", (tmp / "cfg.yaml").string(),
                      "compile=true", std::string("dtype=") + dtype, "output_dir=" + out.string()}),
        0);
    by_dtype[k++] = logged_values(out, "loss");
  }
  ASSERT_EQ(by_dtype[1].size(), 8u);
  EXPECT_NEAR(by_dtype[1][0], std::log(2.0), 1e-6);
  for (size_t i = 0; i < by_dtype[0].size(); ++i)
    EXPECT_NEAR(by_dtype[1][i], by_dtype[0][i], 0.05 * by_dtype[0][i]) << "step " << i + 1;
}

TEST(DpoRecipe, IdenticalAnswersAreABadRowNamedByFileAndLine) {
  TempDir tmp;
  write_file_atomic(tmp / "pairs.jsonl",
                    "{\"prompt\": \"a\", \"chosen\": \"b\", \"rejected\": \"c\"}\n"
                    "{\"prompt\": \"a\", \"chosen\": \"same\", \"rejected\": \"same\"}\n");
  write_file_atomic(tmp / "cfg.yaml", dpo_yaml(tmp / "run", tmp / "pairs.jsonl"));
  try {
    cli::cmd_run({"lora_dpo_single_device", "--config", (tmp / "cfg.yaml").string()});
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("pairs.jsonl line 2"), std::string::npos) << what;
    EXPECT_NE(what.find("identical"), std::string::npos) << what;
  }
}

TEST(DpoRecipe, PlanBuildsThePreferenceStepAndTheReferencePass) {
  TempDir tmp;
  write_pairs(tmp / "pairs.json", 4);
  write_file_atomic(tmp / "cfg.yaml", dpo_yaml(tmp / "run", tmp / "pairs.json"));
  ::testing::internal::CaptureStdout();
  const int rc = cli::cmd_plan({"lora_dpo_single_device", "--config", (tmp / "cfg.yaml").string()});
  const std::string plan = ::testing::internal::GetCapturedStdout();
  ASSERT_EQ(rc, 0) << plan;
  EXPECT_NE(plan.find("step of 4 x 64 tokens"), std::string::npos) << plan;  // 2 pairs = 4 rows
  EXPECT_NE(plan.find("fused_linear_log_probs_backward"), std::string::npos) << plan;
  EXPECT_NE(plan.find("reference forward (every step"), std::string::npos) << plan;
}

// Validation on preference pairs: the mean DPO loss over the held-out pairs. With lr 0 the
// policy stays the reference, so every pair's loss is log 2 (the same data as a check: the
// value is independent of what the pairs say).
TEST(DpoRecipe, ValidationLossIsLog2WhileThePolicyIsTheReference) {
  TempDir tmp;
  write_pairs(tmp / "pairs.json", 8);
  write_file_atomic(tmp / "cfg.yaml", dpo_yaml(tmp / "run", tmp / "pairs.json"));
  ASSERT_EQ(
      cli::cmd_run(
          {"lora_dpo_single_device", "--config", (tmp / "cfg.yaml").string(), "optimizer.lr=0",
           "run_val_every_n_steps=2", "dataset_val._component_=preference",
           "dataset_val.source=" + (tmp / "pairs.json").string(), "dataset_val.split=train[4:]"}),
      0);
  const std::vector<double> val = logged_values(tmp / "run", "val_loss");
  ASSERT_EQ(val.size(), 4u);  // 8 steps (2 epochs of 4), every 2
  for (double v : val) EXPECT_NEAR(v, std::log(2.0), 1e-6);
}

