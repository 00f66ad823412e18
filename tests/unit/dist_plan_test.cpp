// `fusetune plan --nproc_per_node N` against what rank 0 of a real 2-rank run measures
// (peak_memory_alloc_bytes, the counted allocations, communication buffers included), for
// ZeRO stages 0-3 (stage 3 in both compile modes, with and without
// fsdp_reshard_after_forward), full fine-tuning and LoRA: within 10%, as the single-process
// plan.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fusetune/cli/command.h"
#include "fusetune/config/builtin_configs.h"
#include "fusetune/config/schema.h"
#include "fusetune/recipes/distributed_recipes.h"
#include "fusetune/recipes/rank_plan.h"
#include "fusetune/recipes/recipe_setup.h"
#include "fusetune/recipes/registry.h"
#include "fusetune/util/fs.h"
#include "mpi_runs.h"
#include "prepared_config.h"
#include "recipe_runs.h"
#include "test_support.h"

using namespace fusetune;
using namespace fusetune::testing;
namespace fs = std::filesystem;

namespace {

// Packed rows of 64 tokens: every batch has the planned shape (2 x 64 per rank).
std::string plan_yaml(const fs::path& data) {
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

std::vector<std::string> as_overrides(const Overrides& o) {
  std::vector<std::string> v;
  for (const auto& [k, val] : o) v.push_back(k + "=" + val);
  return v;
}

struct Peaks {
  int64_t planned = 0;
  int64_t measured = 0;
};

// The plan's rank-0 peak for one run's overrides, then rank 0's measured peak over a 2-rank run.
Peaks check_run(const std::string& recipe, const fs::path& tmp, Overrides o,
                const std::string& label) {
  const int stage = std::stoi(o.at("zero_stage"));
  const fs::path config = tmp / "cfg.yaml";
  const fs::path out = tmp / (recipe + "_" + label);
  o["output_dir"] = out.string();
  const Config cfg = prepared_config(recipe, config.string(), as_overrides(o));
  const PlannedStep s = plan_step(cfg, recipe, model_architecture(cfg));
  const RankPeak want = plan_rank_peak(s, plan_step_mode(s, s.configured_mode), 2, 0, stage);
  const std::string cmd = mpirun_command(2, recipe, config.string(), o);
  const CliRun r = run_shell(cmd, tmp / ("s_" + recipe + "_" + label));
  EXPECT_EQ(r.code, 0) << cmd << "\n" << r.out << r.err;
  if (r.code != 0) return {want.bytes, 0};
  const double got = double(logged_peak_bytes(out));
  std::printf("%s %s: rank 0 measured %.3f MiB, planned %.3f MiB (%s, %.3f MiB gathered)\n",
              recipe.c_str(), label.c_str(), got / 1048576.0, double(want.bytes) / 1048576.0,
              want.moment.c_str(), double(want.gathered) / 1048576.0);
  EXPECT_NEAR(got / double(want.bytes), 1.0, 0.10)
      << recipe << " " << label << ": measured " << got << ", planned " << want.bytes << " ("
      << want.moment << ")";
  return {want.bytes, int64_t(got)};
}

// Stages 0-2 as configured (compile: true), then stage 3 in both compile modes, resharding
// after the forward or not. Returns the stage 0-2 peaks.
std::vector<Peaks> check_stages(const std::string& recipe, const fs::path& tmp,
                                const Overrides& extra) {
  std::vector<Peaks> peaks;
  for (int stage = 0; stage <= 2; ++stage) {
    Overrides o = extra;
    o["zero_stage"] = std::to_string(stage);
    peaks.push_back(check_run(recipe, tmp, o, "z" + std::to_string(stage)));
  }
  EXPECT_LT(peaks[1].planned, peaks[0].planned) << "ZeRO-1 shards the optimizer state";
  EXPECT_LE(peaks[2].planned, peaks[1].planned);
  for (const char* compile : {"false", "true"}) {
    int64_t kept[2] = {0, 0};
    for (const char* reshard : {"true", "false"}) {
      Overrides o = extra;
      o["zero_stage"] = "3";
      o["compile"] = compile;
      o["fsdp_reshard_after_forward"] = reshard;
      kept[reshard[0] == 'f'] =
          check_run(recipe, tmp, o, std::string("z3_compile_") + compile + "_reshard_" + reshard)
              .planned;
    }
    // (Within 1%: the compiled arena of the two schedules may pack differently.)
    EXPECT_LE(double(kept[0]), 1.01 * double(kept[1]))
        << "keeping the gathered parameters to the backward holds more";
    if (std::string(compile) == "true") {
      EXPECT_LT(kept[0], peaks[2].planned) << "ZeRO-3 shards the parameters too";
    }
  }
  return peaks;
}

}  // namespace

TEST(DistPlan, FullFineTuningRankZeroPeakMatchesThePlanAtEveryStage) {
  FT_REQUIRE_MPIRUN();
  const TempDir tmp;
  write_corpus(tmp / "rows.jsonl");
  write_file_atomic(tmp / "cfg.yaml", plan_yaml(tmp / "rows.jsonl"));
  // Two micro-batches: ZeRO-2 then keeps only the owned gradients' accumulation buffers.
  const std::vector<Peaks> accumulating =
      check_stages("full_finetune_distributed", tmp.path(), {{"gradient_accumulation_steps", "2"}});
  // Each rank's peak falls as the stage rises, measured too. ZeRO-2 reduces each gradient as
  // the backward hands it over, so even one micro-batch's backward holds only the owned ones
  // (about half the gradients here): below stage 1 by at least a quarter of all of them.
  EXPECT_LT(accumulating[1].measured, accumulating[0].measured);
  EXPECT_LT(accumulating[2].measured, accumulating[1].measured);
  const Config cfg = prepared_config("full_finetune_distributed", (tmp / "cfg.yaml").string(),
                                     {"output_dir=" + (tmp / "o").string()});
  const PlannedStep s = plan_step(cfg, "full_finetune_distributed", model_architecture(cfg));
  const int64_t all_gradients = int64_t(sizeof(float)) * count_step_parameters(s).trainable;
  Peaks one[3];
  for (int stage : {1, 2})
    one[stage] =
        check_run("full_finetune_distributed", tmp.path(), {{"zero_stage", std::to_string(stage)}},
                  "one_micro_batch_z" + std::to_string(stage));
  EXPECT_LT(one[2].measured, one[1].measured - all_gradients / 4)
      << "ZeRO-2's backward frees the gradients other ranks own as they are reduced";
  EXPECT_LT(one[2].planned, one[1].planned - all_gradients / 4);
}

TEST(DistPlan, LoraRankZeroPeakMatchesThePlanAtEveryStage) {
  FT_REQUIRE_MPIRUN();
  const TempDir tmp;
  write_corpus(tmp / "rows.jsonl");
  write_file_atomic(tmp / "cfg.yaml", plan_yaml(tmp / "rows.jsonl"));
  check_stages("lora_finetune_distributed", tmp.path(),
               {{"model.lora_attn_modules", "[q_proj,v_proj]"},
                {"model.apply_lora_to_mlp", "true"},
                {"model.lora_rank", "8"}});
}

TEST(DistPlan, PlanPrintsEveryStageAndRefusesSingleDeviceRecipes) {
  const TempDir tmp;
  write_corpus(tmp / "rows.jsonl");
  write_file_atomic(tmp / "cfg.yaml", plan_yaml(tmp / "rows.jsonl"));
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
  for (const char* row : {"\n0  ", "\n1  ", "\n2  ", "\n3  "})
    EXPECT_NE(out.find(row), std::string::npos) << row << "\n" << out;
  EXPECT_NE(out.find("gathered; reshard_after_forward: true)"), std::string::npos) << out;
  EXPECT_EQ(out.find("not predicted"), std::string::npos) << out;
  try {
    cli::cmd_plan({"full_finetune_single_device", "--config", config, "--nproc_per_node", "2"});
    FAIL() << "a single-device recipe has no ranks";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("--nproc_per_node plans a *_distributed recipe"),
              std::string::npos)
        << e.what();
  }
}

// ZeRO-3 per rank without running: each rank peaks below stage 2, the optimizer-state shards
// add up to the whole state, and keeping the gathered parameters from the forward to the
// backward does not lower a peak (up to the arena's packing).
TEST(DistPlan, Zero3PlanShardsTheParametersAndKeepsGatheredOnesWithoutReshard) {
  const TempDir tmp;
  write_corpus(tmp / "rows.jsonl");
  write_file_atomic(tmp / "cfg.yaml", plan_yaml(tmp / "rows.jsonl"));
  for (const char* mode : {"false", "true"}) {
    const std::vector<std::string> base = {"output_dir=" + (tmp / "o").string(),
                                           std::string("compile=") + mode};
    std::vector<std::string> keep = base;
    keep.push_back("fsdp_reshard_after_forward=false");
    keep.push_back("zero_stage=3");
    const Config cfg =
        prepared_config("full_finetune_distributed", (tmp / "cfg.yaml").string(), base);
    const Config kept_cfg =
        prepared_config("full_finetune_distributed", (tmp / "cfg.yaml").string(), keep);
    const PlannedStep s = plan_step(cfg, "full_finetune_distributed", model_architecture(cfg));
    const PlannedStep k =
        plan_step(kept_cfg, "full_finetune_distributed", model_architecture(kept_cfg));
    EXPECT_TRUE(s.reshard_after_forward);
    EXPECT_FALSE(k.reshard_after_forward);
    const ModePlan p = plan_step_mode(s, s.configured_mode);
    const RankPeak stage2 = plan_rank_peak(s, p, 3, 0, 2);
    int64_t optimizer = 0;
    for (int r = 0; r < 3; ++r) {
      const RankPeak r3 = plan_rank_peak(s, p, 3, r, 3);
      const RankPeak kept = plan_rank_peak(k, plan_step_mode(k, k.configured_mode), 3, r, 3);
      EXPECT_LT(r3.bytes, plan_rank_peak(s, p, 3, r, 2).bytes) << mode << " rank " << r;
      EXPECT_LE(double(r3.bytes), 1.01 * double(kept.bytes)) << mode << " rank " << r;
      EXPECT_EQ(r3.optimizer_state, plan_rank_peak(s, p, 3, r, 1).optimizer_state);
      optimizer += r3.optimizer_state;
    }
    EXPECT_EQ(optimizer, p.memory.optimizer_state) << "the shards add up to the whole state";
    EXPECT_LT(plan_rank_peak(s, p, 3, 0, 3).bytes, stage2.bytes);
  }
}

// QLoRA at ZeRO-3: the base's packed NF4 parts are sharded with the frozen parameters and
// gathered packed at use; the plan replays that graph, within 10% of rank 0's measured peak,
// in both compile modes, and the base's share makes stage 3 hold less than stage 2.
TEST(DistPlan, Zero3WithAnNF4BasePlansTheShardedPackedBase) {
  FT_REQUIRE_MPIRUN();
  const TempDir tmp;
  write_corpus(tmp / "rows.jsonl");
  write_file_atomic(tmp / "cfg.yaml", plan_yaml(tmp / "rows.jsonl"));
  Overrides o = {{"model.lora_attn_modules", "[q_proj,v_proj]"},
                 {"model.apply_lora_to_mlp", "true"},
                 {"model.quantize_base", "true"}};
  o["zero_stage"] = "2";
  const Peaks stage2 = check_run("lora_finetune_distributed", tmp.path(), o, "qlora_z2");
  for (const char* compile : {"false", "true"}) {
    o["zero_stage"] = "3";
    o["compile"] = compile;
    const Peaks stage3 = check_run("lora_finetune_distributed", tmp.path(), o,
                                   std::string("qlora_z3_compile_") + compile);
    if (std::string(compile) == "true") {
      EXPECT_LT(stage3.planned, stage2.planned);
      EXPECT_LT(stage3.measured, stage2.measured);
    }
  }
  ::testing::internal::CaptureStdout();
  const int rc =
      cli::cmd_plan({"lora_finetune_distributed", "--config", (tmp / "cfg.yaml").string(),
                     "--nproc_per_node", "2", "model.lora_attn_modules=[q_proj,v_proj]",
                     "model.quantize_base=true", "output_dir=" + (tmp / "o").string()});
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("\n3  "), std::string::npos) << out;
  EXPECT_NE(out.find("gathered; reshard_after_forward: true)"), std::string::npos) << out;
}
