// Memory that stays where the plan says, and steps that must not be applied.
// - Unpacked data pads batches to several lengths; every compiled step shares one arena, so
//   the run's measured peak is the plan's for its largest batch shape (it used to grow with
//   each new padded length: one arena per shape).
// - A step whose loss or gradient norm is not finite stops the run before the update, naming
//   the step, its samples and the last complete checkpoint.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fusetune/cli/command.h"
#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/util/fs.h"
#include "metrics_log.h"
#include "test_support.h"

using namespace fusetune;
using namespace fusetune::testing;
namespace fs = std::filesystem;

namespace {

std::string guard_yaml(const fs::path& out, const fs::path& data) {
  std::ostringstream s;
  s << "output_dir: " << out.string() << "\n"
    << "model:\n  init: random\n  model_type: llama\n  vocab_size: 259\n  hidden_size: 128\n"
    << "  intermediate_size: 512\n  num_hidden_layers: 4\n  num_attention_heads: 4\n"
    << "  num_key_value_heads: 2\n  max_position_embeddings: 512\n"
    << "tokenizer:\n  _component_: byte\n  max_seq_len: 512\n"
    << "dataset:\n  _component_: text_completion\n  source: " << data.string()
    << "\n  packed: false\n"
    << "seed: 2\nshuffle: true\nbatch_size: 1\nepochs: 1\n"
    << "optimizer:\n  _component_: AdamW\n  lr: 1e-3\n"
    << "compile: true\nnum_threads: 1\nlog_every_n_steps: 1\nlog_peak_memory_stats: true\n";
  return s.str();
}

// Rows of 150, 300 and 480 bytes: padded (with BOS and EOS) to 192, 320 and 512 tokens.
void write_rows(const fs::path& p) {
  std::string text;
  for (int i = 0; i < 12; ++i) {
    const size_t n = i % 3 == 0 ? 150 : i % 3 == 1 ? 300 : 480;
    text += nlohmann::json({{"text", std::string(n, char('a' + i % 26))}}).dump() + "\n";
  }
  write_file_atomic(p, text);
}

double plan_peak_mib(const std::vector<std::string>& args) {
  ::testing::internal::CaptureStdout();
  const int rc = cli::cmd_plan(args);
  const std::string plan = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(rc, 0) << plan;
  EXPECT_NE(plan.find("step of 1 x 512 tokens, the largest batch shape the config allows"),
            std::string::npos)
      << plan;
  std::istringstream lines(plan);
  for (std::string line; std::getline(lines, line);)
    if (line.find("<- this config") != std::string::npos) {
      std::istringstream f(line);
      std::string name, kernels, unit;
      double mib = 0;
      f >> name >> kernels >> mib >> unit;
      EXPECT_EQ(unit, "MiB") << line;
      return mib;
    }
  ADD_FAILURE() << "no '<- this config' line in\n" << plan;
  return 0;
}

}  // namespace

TEST(MemoryAcrossShapes, CompiledUnpackedRunPeaksAtThePlanForItsLargestShape) {
  TempDir tmp;
  write_rows(tmp / "rows.jsonl");
  write_file_atomic(tmp / "cfg.yaml", guard_yaml(tmp / "run", tmp / "rows.jsonl"));
  for (const char* mode : {"compile=true", "compile=model"}) {
    const fs::path out = tmp / (std::string("run_") + mode);
    const std::vector<std::string> args = {"full_finetune_single_device", "--config",
                                           (tmp / "cfg.yaml").string(), mode,
                                           "output_dir=" + out.string()};
    // The plan is for the largest shape the config allows: batch_size x max_seq_len (512),
    // which the 480-byte rows reach.
    const double planned = plan_peak_mib(args);
    ASSERT_EQ(cli::cmd_run(args), 0);
    const std::vector<double> peaks = logged_values(out, "peak_memory_alloc_bytes");
    ASSERT_FALSE(peaks.empty());
    const double peak = *std::max_element(peaks.begin(), peaks.end());
    std::printf("%s: measured peak %.1f MiB, planned %.1f MiB\n", mode, peak / 1048576.0, planned);
    EXPECT_NEAR(peak / 1048576.0 / planned, 1.0, 0.10)
        << mode << ": measured " << peak / 1048576.0 << " MiB, planned " << planned << " MiB";
  }
}

TEST(NonFiniteGuard, ADivergedStepIsNotAppliedAndNamesItsSamplesAndCheckpoint) {
  TempDir tmp;
  write_rows(tmp / "rows.jsonl");
  write_file_atomic(tmp / "cfg.yaml", guard_yaml(tmp / "run", tmp / "rows.jsonl"));
  // lr 1e30: step 1 throws the weights to ~1e30, step 2's loss is not finite.
  const std::vector<std::string> args = {"full_finetune_single_device", "--config",
                                         (tmp / "cfg.yaml").string(),   "optimizer.lr=1e30",
                                         "save_every_n_steps=1",        "compile=false",
                                         "model.num_hidden_layers=1"};
  try {
    cli::cmd_run(args);
    FAIL() << "the run should stop";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("step 2: the "), std::string::npos) << what;
    EXPECT_NE(what.find("the update was not applied"), std::string::npos) << what;
    EXPECT_NE(what.find("dataset indices): ["), std::string::npos) << what;
    EXPECT_NE(what.find((tmp / "run" / "step_1").string()), std::string::npos) << what;
  }
  // The last complete checkpoint is intact and resumable; nothing of step 2 was written.
  EXPECT_TRUE(fs::exists(tmp / "run" / "step_1" / "recipe_state.json"));
  EXPECT_FALSE(fs::exists(tmp / "run" / "step_2"));
}
