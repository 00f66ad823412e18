// torchtune's checkpointer.keep_last_n_checkpoints (old checkpoints removed only after a new
// one is complete, never the one a resume needs), low_cpu_ram (accepted, a log line says why
// it changes nothing), and the bitsandbytes 8-bit optimizer keys in configs and runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

#include <nlohmann/json.hpp>

#include "checks.h"
#include "files.h"
#include "fusetune/cli/command.h"
#include "fusetune/config/recipe_schemas.h"
#include "fusetune/config/schema.h"
#include "fusetune/recipes/training_checkpoint.h"
#include "fusetune/util/error.h"
#include "fusetune/util/fs.h"
#include "metrics_log.h"
#include "test_support.h"
#include "tiny_llama.h"

using namespace fusetune;
using namespace fusetune::testing;
namespace fs = std::filesystem;

namespace {

// A directory that latest_resumable_checkpoint accepts (only recipe_state.json is read).
void fake_checkpoint(const fs::path& dir, int64_t global_step) {
  fs::create_directories(dir);
  nlohmann::json j = {{"format", "fusetune.recipe_state.v1"},
                      {"epoch", 0},
                      {"step_in_epoch", global_step},
                      {"global_step", global_step},
                      {"loader_epoch", 0},
                      {"loader_index", global_step},
                      {"seed", 1}};
  write_file_atomic(dir / "recipe_state.json", j.dump());
  write_file_atomic(dir / "config.json", "{}");
}

using Names = std::vector<std::string>;

}  // namespace

TEST(KeepLastN, RemovesOlderCheckpointsBeyondN) {
  TempDir tmp;
  const fs::path out = tmp / "out";
  fake_checkpoint(out / "step_2", 2);
  fake_checkpoint(out / "step_4", 4);
  fake_checkpoint(out / "step_6", 6);
  fake_checkpoint(out / "epoch_0", 8);
  fs::create_directories(out / "step_1");  // no recipe_state.json: not resumable, not ours
  fs::create_directories(out / "step_3");  // damaged state: left alone
  write_file_atomic(out / "step_3" / "recipe_state.json", "{not json");
  fs::create_directories(out / "epoch_0.tmp-1-2");  // a staging leftover
  fs::create_directories(out / "logs");
  const auto removed = prune_checkpoints(out, out / "epoch_0", 2);
  ASSERT_EQ(removed.size(), 2u);
  EXPECT_EQ(sorted_entries(out),
            (Names{"epoch_0", "epoch_0.tmp-1-2", "logs", "step_1", "step_3", "step_6"}));
  EXPECT_EQ(latest_resumable_checkpoint(out)->filename(), "epoch_0");
  // Idempotent.
  EXPECT_TRUE(prune_checkpoints(out, out / "epoch_0", 2).empty());
  // N = 1 keeps only the new one.
  EXPECT_EQ(prune_checkpoints(out, out / "epoch_0", 1).size(), 1u);
  EXPECT_EQ(sorted_entries(out), (Names{"epoch_0", "epoch_0.tmp-1-2", "logs", "step_1", "step_3"}));
}

TEST(KeepLastN, NothingIsRemovedUntilTheNewCheckpointIsComplete) {
  TempDir tmp;
  const fs::path out = tmp / "out";
  fake_checkpoint(out / "step_2", 2);
  fake_checkpoint(out / "step_4", 4);
  // The new one does not exist, is only staged, or lacks its recipe state: nothing removed.
  EXPECT_TRUE(prune_checkpoints(out, out / "step_6", 1).empty());
  fs::create_directories(out / "step_6.tmp-1-1");
  EXPECT_TRUE(prune_checkpoints(out, out / "step_6.tmp-1-1", 1).empty());
  fs::create_directories(out / "step_6");
  write_file_atomic(out / "step_6" / "config.json", "{}");
  EXPECT_TRUE(prune_checkpoints(out, out / "step_6", 1).empty());
  EXPECT_EQ(sorted_entries(out), (Names{"step_2", "step_4", "step_6", "step_6.tmp-1-1"}));
}

TEST(KeepLastN, NeverRemovesTheNewOneNorWhatAResumeWouldPick) {
  TempDir tmp;
  const fs::path out = tmp / "out";
  // A stale step_90 from an earlier run in the same output_dir has more steps than the new
  // step_4: a resume would pick it, so it stays; so does the new one.
  fake_checkpoint(out / "step_90", 90);
  fake_checkpoint(out / "step_2", 2);
  fake_checkpoint(out / "step_4", 4);
  const auto removed = prune_checkpoints(out, out / "step_4", 1);
  ASSERT_EQ(removed.size(), 1u);
  EXPECT_EQ(removed[0].filename(), "step_2");
  EXPECT_EQ(sorted_entries(out), (Names{"step_4", "step_90"}));
}

TEST(KeepLastN, RejectsNBelowOne) {
  TempDir tmp;
  fake_checkpoint(tmp / "step_1", 1);
  EXPECT_THROW(prune_checkpoints(tmp.path(), tmp / "step_1", 0), Error);
  Config cfg = Config::from_string(
      "output_dir: /tmp/x\nmodel:\n  init: checkpoint\ncheckpointer:\n  checkpoint_dir: /tmp/y\n"
      "  keep_last_n_checkpoints: 0\n"
      "tokenizer:\n  _component_: byte\ndataset:\n  _component_: text_completion\n  source: a.txt\n"
      "optimizer:\n  _component_: AdamW\n  lr: 1e-3\n",
      "test.yaml");
  const Problems p = check_config(cfg, full_finetune_schema());
  ASSERT_EQ(p.errors.size(), 1u);
  EXPECT_NE(p.errors[0].find("keep_last_n_checkpoints' must be >= 1"), std::string::npos)
      << p.errors[0];
}

namespace {

std::string tiny_yaml(const fs::path& out, const std::string& extra) {
  std::ostringstream s;
  s << "output_dir: " << out.string() << "\n"
    << tiny_model_yaml(64) << "tokenizer:\n  _component_: byte\n  max_seq_len: 32\n"
    << "dataset:\n  _component_: text_completion\n  source: " << source_dir()
    << "/configs/demo/demo_corpus.txt\n  packed: true\n"
    << "seed: 5\nshuffle: true\nbatch_size: 2\nepochs: 1\nmax_steps_per_epoch: 7\n"
    << "save_every_n_steps: 2\n"
    << "optimizer:\n  _component_: AdamW\n  lr: 1e-2\n"
    << "num_threads: 1\nlog_every_n_steps: 1\nlog_peak_memory_stats: false\n"
    << extra;
  return s.str();
}

// A checkpointer section (checkpoint_dir is required there, unused by model.init: random).
std::string keep(const TempDir& tmp, int n) {
  return "checkpointer:\n  checkpoint_dir: " + tmp.path().string() +
         "\n  keep_last_n_checkpoints: " + std::to_string(n) + "\n";
}

std::string log_text(const fs::path& out) {
  std::string all;
  for (const auto& e : fs::directory_iterator(out / "logs"))
    if (e.path().filename().string().rfind("log_", 0) == 0) all += read_file(e.path());
  return all;
}

}  // namespace

TEST(KeepLastN, RunKeepsTheLastTwoAndResumes) {
  TempDir tmp;
  write_file_atomic(tmp / "cfg.yaml", tiny_yaml(tmp / "out", keep(tmp, 2)));
  ASSERT_EQ(cli::cmd_run({"full_finetune_single_device", "--config", (tmp / "cfg.yaml").string()}),
            0);
  // step_2, step_4, step_6, epoch_0 were written, each complete before the older went.
  EXPECT_EQ(sorted_entries(tmp / "out"), (Names{"epoch_0", "logs", "step_6"}));
  const std::string log = log_text(tmp / "out");
  EXPECT_EQ(occurrences(log, "Removed checkpoint"), 2u) << log;
  // Removal is logged after the new one's "Saved".
  EXPECT_LT(log.find("Saved checkpoint to " + (tmp / "out" / "step_6").string()),
            log.find("Removed checkpoint " + (tmp / "out" / "step_2").string()));

  // A second epoch resumed from epoch_0 prunes what came before it.
  ASSERT_EQ(cli::cmd_run({"full_finetune_single_device", "--config", (tmp / "cfg.yaml").string(),
                          "epochs=2", "resume_from_checkpoint=true"}),
            0);
  EXPECT_EQ(sorted_entries(tmp / "out"), (Names{"epoch_1", "logs", "step_12"}));
}

TEST(KeepLastN, AFailedNewCheckpointRemovesNothing) {
  TempDir tmp;
  write_file_atomic(tmp / "cfg.yaml", tiny_yaml(tmp / "out", keep(tmp, 1)));
  // step_4 cannot be written (a non-checkpoint directory is in the way): the run fails at its
  // save, and step_2 -- the only complete checkpoint -- must still be there.
  fs::create_directories(tmp / "out" / "step_4");
  write_file_atomic(tmp / "out" / "step_4" / "notes.txt", "mine");
  EXPECT_THROW(
      cli::cmd_run({"full_finetune_single_device", "--config", (tmp / "cfg.yaml").string()}),
      Error);
  EXPECT_TRUE(fs::exists(tmp / "out" / "step_2" / "recipe_state.json"));
  EXPECT_TRUE(fs::exists(tmp / "out" / "step_4" / "notes.txt"));
  EXPECT_EQ(latest_resumable_checkpoint(tmp / "out")->filename(), "step_2");
}

TEST(LowCpuRam, AcceptedWithALogLineAndChangesNothing) {
  TempDir tmp;
  write_file_atomic(tmp / "a.yaml", tiny_yaml(tmp / "a", ""));
  write_file_atomic(tmp / "b.yaml", tiny_yaml(tmp / "b", "low_cpu_ram: true\n"));
  ASSERT_EQ(cli::cmd_run({"full_finetune_single_device", "--config", (tmp / "a.yaml").string()}),
            0);
  ASSERT_EQ(cli::cmd_run({"full_finetune_single_device", "--config", (tmp / "b.yaml").string()}),
            0);
  EXPECT_EQ(logged_values(tmp / "a", "loss"), logged_values(tmp / "b", "loss"));
  EXPECT_EQ(occurrences(log_text(tmp / "b"), "low_cpu_ram: true changes nothing"), 1u);
  EXPECT_EQ(occurrences(log_text(tmp / "a"), "low_cpu_ram"), 0u);
}

TEST(AdamW8bitConfig, PagedRunsWithOneWarningAndResumes) {
  TempDir tmp;
  write_file_atomic(tmp / "cfg.yaml", tiny_yaml(tmp / "out", ""));
  const std::vector<std::string> base = {
      "full_finetune_single_device", "--config", (tmp / "cfg.yaml").string(),
      "optimizer._component_=bitsandbytes.optim.PagedAdamW8bit", "optimizer.min_8bit_size=1024"};
  ASSERT_EQ(cli::cmd_run(base), 0);
  const std::string log = log_text(tmp / "out");
  EXPECT_EQ(occurrences(log, "paging (CUDA unified memory"), 1u) << log;
  const std::vector<double> whole = logged_values(tmp / "out", "loss");
  ASSERT_EQ(whole.size(), 7u);
  // The saved state is the 8-bit state: codes and absmax, no fp32 moments for the matrices.
  const std::string state = read_file(tmp / "out" / "step_4" / "recipe_state.safetensors");
  EXPECT_NE(state.find("layers.0.self_attn.q_proj.weight.state1"), std::string::npos);
  EXPECT_EQ(state.find("layers.0.self_attn.q_proj.weight.exp_avg"), std::string::npos);
  EXPECT_NE(state.find("model.norm.weight.exp_avg_sq"), std::string::npos);

  // Resume from step_4 continues bit for bit.
  fs::create_directories(tmp / "resumed");
  fs::copy(tmp / "out" / "step_4", tmp / "resumed" / "step_4", fs::copy_options::recursive);
  std::vector<std::string> args = base;
  args.push_back("output_dir=" + (tmp / "resumed").string());
  args.push_back("resume_from_checkpoint=true");
  ASSERT_EQ(cli::cmd_run(args), 0);
  const std::vector<double> resumed = logged_values(tmp / "resumed", "loss");
  ASSERT_EQ(resumed.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(resumed[i], whole[4 + i]) << "step " << 5 + i;
}

TEST(AdamW8bitConfig, EveryBitsandbytesKeyIsImplementedOrRefusedWithAReason) {
  auto problems = [](const std::string& optimizer) {
    Config cfg = Config::from_string(
        "output_dir: /tmp/x\nmodel:\n  init: checkpoint\ncheckpointer:\n  checkpoint_dir: /tmp/y\n"
        "tokenizer:\n  _component_: byte\ndataset:\n  _component_: text_completion\n"
        "  source: a.txt\noptimizer:\n" +
            optimizer,
        "test.yaml");
    return check_config(cfg, full_finetune_schema());
  };
  // Accepted: every key bitsandbytes' AdamW8bit takes, at values fusetune implements.
  Problems ok = problems(
      "  _component_: bitsandbytes.optim.AdamW8bit\n  lr: 1e-3\n  betas: [0.9, 0.95]\n"
      "  eps: 1e-6\n  weight_decay: 0.1\n  amsgrad: false\n  optim_bits: 32\n"
      "  min_8bit_size: 16384\n  percentile_clipping: 100\n  block_wise: true\n"
      "  is_paged: false\n");
  EXPECT_TRUE(ok.errors.empty()) << ok.errors[0];
  // PagedAdamW8bit has no is_paged argument (a TypeError in bitsandbytes).
  Problems paged =
      problems("  _component_: bitsandbytes.optim.PagedAdamW8bit\n  lr: 2e-5\n  is_paged: true\n");
  ASSERT_EQ(paged.errors.size(), 1u);
  EXPECT_NE(paged.errors[0].find("is_paged"), std::string::npos);
  // Refused, each with its reason.
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"amsgrad: true", "no AMSGrad"},
      {"percentile_clipping: 5", "percentile gradient clipping is not implemented"},
      {"block_wise: false", "only block-wise 8-bit state"},
      {"optim_bits: 16", "only 8 or 32 are accepted"}};
  for (const auto& [line, why] : refused) {
    Problems p =
        problems("  _component_: bitsandbytes.optim.AdamW8bit\n  lr: 1e-3\n  " + line + "\n");
    ASSERT_EQ(p.errors.size(), 1u) << line;
    EXPECT_NE(p.errors[0].find(why), std::string::npos) << p.errors[0];
  }
  // torchao's AdamW8bit (another block size and quantizer) is not implemented.
  Problems ao = problems("  _component_: torchao.optim.AdamW8bit\n  lr: 1e-3\n");
  ASSERT_FALSE(ao.errors.empty());
}
