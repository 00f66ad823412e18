// `fusetune plan --nproc_per_node N` against what rank 0 of a real 2-rank run measures
// (peak_memory_alloc_bytes, the counted allocations, communication buffers included), for
// ZeRO stages 0, 1 and 2, full fine-tuning and LoRA: within 10%, as the single-process plan.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fusetune/cli/command.h"
#include "fusetune/config/builtin_configs.h"
#include "fusetune/config/schema.h"
#include "fusetune/recipes/rank_plan.h"
#include "fusetune/recipes/recipe_setup.h"
#include "fusetune/recipes/registry.h"
#include "fusetune/util/fs.h"
#include "mpi_runs.h"
#include "recipe_runs.h"
#include "test_support.h"

using namespace fusetune;
using namespace fusetune::testing;
namespace fs = std::filesystem;

namespace {

// Packed rows of 64 tokens: every batch has the planned shape (2 x 64 per rank).
std::string yaml(const fs::path& data) {
  std::ostringstream s;
  s << "model:\n  init: random\n  model_type: llama\n  vocab_size: 259\n  hidden_size: 128\n"
    << "  intermediate_size: 352\n  num_hidden_layers: 3\n  num_attention_heads: 4\n"
    << "  num_key_value_heads: 2\n  max_position_embeddings: 128\n"
    << "  tie_word_embeddings: false\n"
    << "tokenizer:\n  _component_: byte\n  max_seq_len: 64\n"
    << "dataset:\n  _component_: text_completion\n  source: " << data.string()
    << "\n  packed: true\n"
    << "seed: 5\nshuffle: true\nbatch_size: 2\nepochs: 1\nmax_steps_per_epoch: 2\n"
    << "optimizer:\n  _component_: AdamW\n  lr: 1e-3\n"
    << "compile: true\nnum_threads: 1\nlog_every_n_steps: 1\nlog_peak_memory_stats: true\n";
  return s.str();
}

void write_corpus(const fs::path& p) {
  std::string text;
  const std::string words = "a plan says what each rank holds when its step peaks ";
  for (int i = 0; i < 40; ++i)
    text += nlohmann::json({{"text", words + words.substr(size_t(i % 20))}}).dump() + "\n";
  write_file_atomic(p, text);
}

Config prepared(const std::string& recipe, const fs::path& config,
                const std::vector<std::string>& overrides) {
  Config c = load_config(config.string());
  c.apply_overrides(overrides);
  c.resolve();
  const Schema& schema = *find_recipe(recipe).schema;
  validate(c, schema);
  return with_defaults(c, schema);
}

std::vector<std::string> as_overrides(const Overrides& o) {
  std::vector<std::string> v;
  for (const auto& [k, val] : o) v.push_back(k + "=" + val);
  return v;
}

// For each stage: the plan's rank-0 peak, then rank 0's measured peak over a 2-rank run.
void check_stages(const std::string& recipe, const fs::path& tmp, const Overrides& extra) {
  const fs::path config = tmp / "cfg.yaml";
  std::vector<int64_t> planned;
  for (int stage = 0; stage <= 2; ++stage) {
    Overrides o = extra;
    o["zero_stage"] = std::to_string(stage);
    const fs::path out = tmp / (recipe + "_z" + std::to_string(stage));
    o["output_dir"] = out.string();
    const Config cfg = prepared(recipe, config, as_overrides(o));
    const PlannedStep s = plan_step(cfg, recipe, model_architecture(cfg));
    const RankPeak want = plan_rank_peak(s, plan_step_mode(s, s.configured_mode), 2, 0, stage);
    planned.push_back(want.bytes);
    const std::string cmd = mpirun_command(2, recipe, config.string(), o);
    const CliRun r = run_shell(cmd, tmp / ("s_" + recipe + std::to_string(stage)));
    ASSERT_EQ(r.code, 0) << cmd << "\n" << r.out << r.err;
    const double got = double(logged_peak_bytes(out));
    std::printf("%s zero_stage %d: rank 0 measured %.3f MiB, planned %.3f MiB (%s)\n",
                recipe.c_str(), stage, got / 1048576.0, double(want.bytes) / 1048576.0,
                want.moment.c_str());
    EXPECT_NEAR(got / double(want.bytes), 1.0, 0.10)
        << recipe << " zero_stage " << stage << ": measured " << got << ", planned " << want.bytes
        << " (" << want.moment << ")";
  }
  EXPECT_LT(planned[1], planned[0]) << "ZeRO-1 shards the optimizer state";
  EXPECT_LE(planned[2], planned[1]);
}

}  // namespace

TEST(DistPlan, FullFineTuningRankZeroPeakMatchesThePlanAtEveryStage) {
  FT_REQUIRE_MPIRUN();
  const TempDir tmp;
  write_corpus(tmp / "rows.jsonl");
  write_file_atomic(tmp / "cfg.yaml", yaml(tmp / "rows.jsonl"));
  // Two micro-batches: ZeRO-2 then keeps only the owned gradients' accumulation buffers.
  check_stages("full_finetune_distributed", tmp.path(), {{"gradient_accumulation_steps", "2"}});
}

TEST(DistPlan, LoraRankZeroPeakMatchesThePlanAtEveryStage) {
  FT_REQUIRE_MPIRUN();
  const TempDir tmp;
  write_corpus(tmp / "rows.jsonl");
  write_file_atomic(tmp / "cfg.yaml", yaml(tmp / "rows.jsonl"));
  check_stages("lora_finetune_distributed", tmp.path(),
               {{"model.lora_attn_modules", "[q_proj,v_proj]"},
                {"model.apply_lora_to_mlp", "true"},
                {"model.lora_rank", "8"}});
}

TEST(DistPlan, PlanPrintsEveryStageAndRefusesStage3AndSingleDeviceRecipes) {
  const TempDir tmp;
  write_corpus(tmp / "rows.jsonl");
  write_file_atomic(tmp / "cfg.yaml", yaml(tmp / "rows.jsonl"));
  const std::string config = (tmp / "cfg.yaml").string();
  ::testing::internal::CaptureStdout();
  const int rc = cli::cmd_plan({"full_finetune_distributed", "--config", config, "--nproc_per_node",
                                "4", "output_dir=" + (tmp / "o").string()});
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("per-rank peak with --nproc_per_node 4 (compile: true; batch_size 2 per "
                     "rank, global batch 8)"),
            std::string::npos)
      << out;
  for (const char* row : {"\n0  ", "\n1  ", "\n2  "})
    EXPECT_NE(out.find(row), std::string::npos) << row << "\n" << out;
  EXPECT_NE(out.find("\n3          not predicted yet"), std::string::npos) << out;
  try {
    cli::cmd_plan({"full_finetune_single_device", "--config", config, "--nproc_per_node", "2"});
    FAIL() << "a single-device recipe has no ranks";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("--nproc_per_node plans a *_distributed recipe"),
              std::string::npos)
        << e.what();
  }
}
