// The distributed DPO recipes (2 ranks x 1 thread): 2 ranks x b pairs give the losses of one
// process x 2b pairs (fp32, relative 1e-5): the DPO loss is a mean over preference pairs, so
// the normalizer all-reduced over the ranks is the global pair count. Reruns are bitwise
// identical. The references are the single-device DPO recipes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fusetune/recipes/rank_plan.h"
#include "fusetune/recipes/recipe_setup.h"
#include "mpi_runs.h"
#include "prepared_config.h"
#include "recipe_runs.h"
#include "test_support.h"
#include "tiny_llama.h"

using namespace fusetune::testing;
namespace fs = std::filesystem;

namespace {

// Answers of different lengths: each rank's response-token count differs, so only a per-pair
// normalization matches the reference.
fs::path write_uneven_pairs(const fs::path& dir) {
  nlohmann::json rows = nlohmann::json::array();
  for (int i = 0; i < 48; ++i) {
    const std::string tail(size_t(i * 7 % 23), char('a' + i % 26));
    rows.push_back({{"prompt", "Name a color " + std::to_string(i) + "."},
                    {"chosen", (i % 2 ? "Blue, like the sky " : "Green ") + tail},
                    {"rejected", (i % 3 ? "I will not " : "Seven is a number ") +
                                     std::string(size_t(i * 5 % 17), 'z')}});
  }
  const fs::path p = dir / "pairs.json";
  write_text(p, rows.dump());
  return p;
}

std::string dist_dpo_yaml(const fs::path& pairs, const fs::path& checkpoint) {
  std::ostringstream s;
  if (checkpoint.empty())
    s << tiny_model_yaml(128) << tiny_dpo_lora_yaml();
  else
    s << "model:\n  init: checkpoint\ncheckpointer:\n  checkpoint_dir: " << checkpoint.string()
      << "\n  checkpoint_files: [model.safetensors]\nref_checkpointer:\n  checkpoint_dir: "
      << checkpoint.string() << "\n  checkpoint_files: [model.safetensors]\n";
  s << "tokenizer:\n  _component_: byte\n  max_seq_len: 64\n"
    << "dataset:\n  _component_: preference\n  source: " << pairs.string() << "\n"
    << "seed: 1\nshuffle: true\nepochs: 1\nmax_steps_per_epoch: 6\n"
    << "optimizer:\n  _component_: AdamW\n  lr: 1e-2\n  weight_decay: 0.0\n"
    << "loss:\n  _component_: DPOLoss\n  beta: 0.1\nclip_grad_norm: 1.0\ncompile: false\n"
    << "num_threads: 1\nlog_every_n_steps: 1\nlog_peak_memory_stats: false\n";
  return s.str();
}

// Every logged DPO metric of the 2-rank run is the one-process value over the same pairs
// (relative 1e-5; 1e-6 absolute near 0, where the rewards start): sums and counts are reduced
// over the ranks before dividing, so the mean logit counts every rank's response tokens.
void expect_same_metrics(const fs::path& got, const fs::path& want, const std::string& what) {
  for (const char* key :
       {"rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
        "log_probs/chosen", "log_probs/rejected", "logits/chosen", "logits/rejected"}) {
    const std::vector<double> a = logged_values(got, key), b = logged_values(want, key);
    ASSERT_EQ(a.size(), b.size()) << what << ": " << key;
    ASSERT_FALSE(b.empty()) << what << ": " << key << " is not logged";
    const std::vector<double> margins = logged_values(want, "rewards/margins");
    for (size_t i = 0; i < a.size(); ++i) {
      // The accuracy counts pairs whose reward margin is > 0: a step function, so where the
      // rewards are still ~0 (step 1: policy == reference) rounding decides it.
      if (std::string(key) == "rewards/accuracies" && std::abs(margins.at(i)) <= 1e-4) continue;
      EXPECT_LE(std::abs(a[i] - b[i]), 1e-5 * std::abs(b[i]) + 1e-6)
          << what << ": " << key << " at step " << i + 1 << ": " << a[i] << " vs " << b[i];
    }
  }
}

// One process x `pairs` x accum against 2 ranks x pairs/2 x accum at `stage` (losses and
// metrics); then a rerun of the 2-rank run, bitwise.
void check_equivalence(const std::string& single, const std::string& distributed,
                       const fs::path& tmp, const fs::path& checkpoint, int pairs, int accum,
                       int stage, const Overrides& extra = {}) {
  const fs::path config = tmp / (distributed + ".yaml");
  write_text(config, dist_dpo_yaml(write_uneven_pairs(tmp), checkpoint));
  auto overrides = [&](const fs::path& out, int batch) {
    Overrides o{{"output_dir", out.string()},
                {"batch_size", std::to_string(batch)},
                {"gradient_accumulation_steps", std::to_string(accum)}};
    o.insert(extra.begin(), extra.end());
    return o;
  };
  const fs::path ref = tmp / (single + "_ref");
  run_ok(run_command(single, config.string(), overrides(ref, pairs)), tmp / "s_ref");
  const std::vector<double> want = losses_of(logged_steps(ref));
  ASSERT_EQ(want.size(), 6u);
  Overrides o = overrides(tmp / (distributed + "_two"), pairs / 2);
  o["zero_stage"] = std::to_string(stage);
  run_ok(mpirun_command(2, distributed, config.string(), o), tmp / "s_two");
  const std::vector<double> got = losses_of(logged_steps(tmp / (distributed + "_two")));
  expect_same_curve(
      got, want,
      distributed + " 2 ranks x " + std::to_string(pairs / 2) + " vs 1 x " + std::to_string(pairs));
  expect_same_metrics(tmp / (distributed + "_two"), ref, distributed + " metrics");
  o["output_dir"] = (tmp / (distributed + "_again")).string();
  run_ok(mpirun_command(2, distributed, config.string(), o), tmp / "s_again");
  EXPECT_EQ(losses_of(logged_steps(tmp / (distributed + "_again"))), got) << "rerun, bitwise";
}

}  // namespace

TEST(DistDpo, LoraDpoTwoRanksMatchOneProcessAndRerunsBitwise) {
  FT_REQUIRE_MPIRUN();
  const TempDir tmp;
  check_equivalence("lora_dpo_single_device", "lora_dpo_distributed", tmp.path(), {}, 4, 1, 0);
}

TEST(DistDpo, FullDpoZero2WithAccumulationTwoRanksMatchOneProcessAndRerunsBitwise) {
  FT_REQUIRE_MPIRUN();
  const TempDir tmp;
  const fs::path ckpt = write_tiny_checkpoint(tmp.path());
  // Two micro-batches per step: the global pair count spans them and the ranks.
  check_equivalence("full_dpo_single_device", "full_dpo_distributed", tmp.path(), ckpt, 4, 2, 2);
}

// ZeRO-3: the policy's parameters live on their owners and are gathered at use, in the
// policy's forward and in the reference pass (LoRA: the base without adapters, also in the
// precompute pass, which every rank then runs whole; full: the reference copy is sharded too,
// FullDpoZero3ShardsTheReferenceCopy).
TEST(DistDpo, LoraAndFullDpoZero3TwoRanksMatchOneProcess) {
  FT_REQUIRE_MPIRUN();
  const TempDir tmp;
  for (const char* d : {"lora", "lora_pre", "full"}) fs::create_directories(tmp.path() / d);
  check_equivalence("lora_dpo_single_device", "lora_dpo_distributed", tmp.path() / "lora", {}, 4, 1,
                    3);
  check_equivalence("lora_dpo_single_device", "lora_dpo_distributed", tmp.path() / "lora_pre", {},
                    4, 1, 3, {{"precompute_ref_log_probs", "true"}});
  const fs::path ckpt = write_tiny_checkpoint(tmp.path());
  check_equivalence("full_dpo_single_device", "full_dpo_distributed", tmp.path() / "full", ckpt, 4,
                    1, 3);
}

// Full DPO at ZeRO-3: the reference copy is sharded by the policy's partition too (each rank
// keeps its own share and gathers the others at use), so against stage 2 rank 0 saves about
// half the policy's parameters and half the reference copy; the losses stay bitwise stage 2's
// (a broadcast copies bits).
TEST(DistDpo, FullDpoZero3ShardsTheReferenceCopy) {
  FT_REQUIRE_MPIRUN();
  const TempDir tmp;
  const fs::path ckpt = write_tiny_checkpoint(tmp.path());
  const fs::path config = tmp.path() / "full.yaml";
  write_text(config, dist_dpo_yaml(write_uneven_pairs(tmp.path()), ckpt));
  std::map<std::string, fs::path> out;
  for (const char* precompute : {"false", "true"})
    for (int stage : {2, 3}) {
      const std::string name = "z" + std::to_string(stage) + "_precompute_" + precompute;
      out[name] = tmp.path() / name;
      run_ok(mpirun_command(2, "full_dpo_distributed", config.string(),
                            {{"output_dir", out[name].string()},
                             {"batch_size", "2"},
                             {"zero_stage", std::to_string(stage)},
                             {"precompute_ref_log_probs", precompute},
                             {"log_peak_memory_stats", "true"}}),
             tmp.path() / ("s_" + name));
    }
  EXPECT_EQ(losses_of(logged_steps(out["z3_precompute_false"])),
            losses_of(logged_steps(out["z2_precompute_false"])));
  // The precompute pass gathers the sharded reference on every rank, which then runs every
  // batch: the same table, so the same losses.
  EXPECT_EQ(losses_of(logged_steps(out["z3_precompute_true"])),
            losses_of(logged_steps(out["z2_precompute_true"])));
  // `fusetune plan`'s rank-0 peak within 10% of the measured one, at both stages.
  for (int stage : {2, 3}) {
    const std::string name = "z" + std::to_string(stage) + "_precompute_false";
    const fusetune::Config cfg =
        prepared_config("full_dpo_distributed", config.string(),
                        {"batch_size=2", "zero_stage=" + std::to_string(stage),
                         "output_dir=" + out[name].string()});
    const fusetune::PlannedStep s =
        plan_step(cfg, "full_dpo_distributed", fusetune::model_architecture(cfg));
    const fusetune::RankPeak want =
        plan_rank_peak(s, plan_step_mode(s, s.configured_mode), 2, 0, stage);
    std::printf("full DPO stage %d: rank 0 measured %lld B, planned %lld B (%s)\n", stage,
                (long long)logged_peak_bytes(out[name]), (long long)want.bytes,
                want.moment.c_str());
    EXPECT_NEAR(double(logged_peak_bytes(out[name])) / double(want.bytes), 1.0, 0.10)
        << "stage " << stage << ": measured " << logged_peak_bytes(out[name]) << ", planned "
        << want.bytes << " (" << want.moment << ")";
  }
  const double model_bytes = double(fs::file_size(ckpt / "model.safetensors"));
  const int64_t z2 = logged_peak_bytes(out["z2_precompute_false"]),
                z3 = logged_peak_bytes(out["z3_precompute_false"]);
  const double saved = double(z2 - z3);
  // Half the policy alone would be 0.5 of a copy; with the reference's half, about 1 (less the
  // gather pools).
  EXPECT_GT(saved, 0.75 * model_bytes) << "rank 0's peak: stage 2 " << z2 << " B, stage 3 " << z3
                                       << " B; one copy of the model " << model_bytes << " B";
}

// QLoRA DPO at ZeRO-3: the packed NF4 base parts are sharded like any frozen parameter and
// gathered (packed) at use, for the policy and for its reference (the same base, adapters off).
TEST(DistDpo, QloraDpoZero3TwoRanksMatchOneProcess) {
  FT_REQUIRE_MPIRUN();
  const TempDir tmp;
  check_equivalence("lora_dpo_single_device", "lora_dpo_distributed", tmp.path(), {}, 4, 1, 3,
                    {{"model.quantize_base", "true"}});
}

// precompute_ref_log_probs over 2 ranks: each computes every other batch of the pass and the
// table is shared, bitwise the one process's table at the same batch size (the logged checksum
// of its bits); the training then matches one process x 4 pairs.
TEST(DistDpo, PrecomputedReferenceIsSharedOverRanksBitwiseTheOneProcessTable) {
  FT_REQUIRE_MPIRUN();
  const TempDir tmp;
  const fs::path config = tmp.path() / "precompute.yaml";
  write_text(config, dist_dpo_yaml(write_uneven_pairs(tmp.path()), {}));
  auto overrides = [&](const std::string& name, int batch) {
    return Overrides{{"output_dir", (tmp.path() / name).string()},
                     {"batch_size", std::to_string(batch)},
                     {"precompute_ref_log_probs", "true"}};
  };
  const std::regex re(
      R"(Precomputed reference log-probs of 48 pairs(.*) in .* \(checksum ([0-9a-f]{16})\))");
  auto precomputed = [&](const CliRun& r, const std::string& ranks_note) {
    std::smatch m;
    EXPECT_TRUE(std::regex_search(r.out, m, re)) << r.out;
    if (m.empty()) return std::string();
    EXPECT_EQ(m[1].str(), ranks_note);
    return m[2].str();
  };
  const CliRun one =
      run_shell(run_command("lora_dpo_single_device", config.string(), overrides("one", 2)),
                tmp.path() / "s_one");
  ASSERT_EQ(one.code, 0) << one.out << one.err;
  const CliRun two =
      run_shell(mpirun_command(2, "lora_dpo_distributed", config.string(), overrides("two", 2)),
                tmp.path() / "s_two");
  ASSERT_EQ(two.code, 0) << two.out << two.err;
  const std::string sum_one = precomputed(one, ""), sum_two = precomputed(two, " over 2 ranks");
  EXPECT_FALSE(sum_one.empty());
  EXPECT_EQ(sum_two, sum_one) << "the table of 2 ranks x 2 against 1 process x 2";
  run_ok(run_command("lora_dpo_single_device", config.string(), overrides("ref", 4)),
         tmp.path() / "s_ref");
  expect_same_curve(losses_of(logged_steps(tmp.path() / "two")),
                    losses_of(logged_steps(tmp.path() / "ref")),
                    "precomputed reference, 2 ranks x 2 vs 1 x 4");
}
