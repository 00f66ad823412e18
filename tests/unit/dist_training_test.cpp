// The data-parallel recipes over MPI (2 ranks x 1 thread): 2 ranks x batch b train like one
// process x batch 2b (the loss normalized by the global count of unmasked tokens, gradients
// summed over the ranks), reruns are bitwise identical, a run resumes with another number of
// ranks, and the same holds over TCP. The reference runs are the single-device recipes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include <nlohmann/json.hpp>

#include "mpi_runs.h"
#include "recipe_runs.h"
#include "test_support.h"

using namespace fusetune::testing;
namespace fs = std::filesystem;

namespace {

// 10 optimizer steps of the demo model on that corpus; `batch` per rank.
Overrides run_overrides(const fs::path& out, const fs::path& corpus, int batch,
                        const Overrides& extra = {}) {
  Overrides o = rank_run_overrides(out, corpus, batch, 10, {{"save_every_n_steps", "5"}});
  for (const auto& [k, v] : extra) o[k] = v;
  return o;
}

const Overrides kLora = {{"model.lora_attn_modules", "[q_proj,v_proj]"},
                         {"model.apply_lora_to_mlp", "true"},
                         {"model.lora_rank", "4"}};

std::vector<double> tail(const std::vector<double>& v, size_t from) {
  return std::vector<double>(v.begin() + long(from), v.end());
}

}  // namespace

TEST(DistTraining, FullTwoRanksMatchOneProcessRerunBitwiseZero123AndResumeAcrossRankCounts) {
  FT_REQUIRE_MPIRUN();
  const TempDir tmp;
  const fs::path corpus = write_uneven_corpus(tmp.path());
  // Reference: one process, batch 4.
  const fs::path ref = tmp.path() / "ref";
  run_ok(
      run_command("full_finetune_single_device", "demo/tiny_full", run_overrides(ref, corpus, 4)),
      tmp.path() / "s_ref");
  const std::vector<double> want = losses_of(logged_steps(ref));
  ASSERT_EQ(want.size(), 10u);
  // 2 ranks x batch 2, through `fusetune run --nproc_per_node 2`.
  const fs::path two = tmp.path() / "two";
  std::string cmd = run_command("full_finetune_distributed", "demo/tiny_full",
                                run_overrides(two, corpus, 2, {{"log_peak_memory_stats", "true"}}));
  cmd.replace(cmd.find(" run ") + 5, 0, "--nproc_per_node 2 ");
  const CliRun r = run_shell(cmd, tmp.path() / "s_two");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("ranks:            2 (data parallel; global batch 4)"), std::string::npos)
      << r.out;
  EXPECT_EQ(printed_steps(r.out).size(), 10u) << "only rank 0 prints step lines\n" << r.out;
  EXPECT_NE(r.out.find(" comm_s:"), std::string::npos) << "time in collectives\n" << r.out;
  const std::vector<double> got = losses_of(logged_steps(two));
  expect_same_curve(got, want, "2 ranks x 2 vs 1 x 4");
  // Rerun: bitwise the same losses and weights.
  const fs::path again = tmp.path() / "again";
  run_ok(mpirun_command(2, "full_finetune_distributed", "demo/tiny_full",
                        run_overrides(again, corpus, 2)),
         tmp.path() / "s_again");
  EXPECT_EQ(losses_of(logged_steps(again)), got);
  EXPECT_EQ(read_text(again / "epoch_0" / "model.safetensors"),
            read_text(two / "epoch_0" / "model.safetensors"));
  // ZeRO-1: the same arithmetic, so bitwise the same losses and checkpoint (the optimizer state
  // gathered to rank 0 under the single-process names), with half the optimizer state on rank 0.
  const fs::path z1 = tmp.path() / "z1";
  run_ok(mpirun_command(2, "full_finetune_distributed", "demo/tiny_full",
                        run_overrides(z1, corpus, 2,
                                      {{"zero_stage", "1"}, {"log_peak_memory_stats", "true"}})),
         tmp.path() / "s_z1");
  EXPECT_EQ(losses_of(logged_steps(z1)), got);
  for (const char* f : {"epoch_0/model.safetensors", "epoch_0/recipe_state.safetensors",
                        "step_5/recipe_state.safetensors"})
    EXPECT_EQ(read_text(z1 / f), read_text(two / f)) << f;
  const double state_bytes = double(fs::file_size(two / "epoch_0" / "recipe_state.safetensors"));
  EXPECT_LT(double(logged_peak_bytes(z1)), double(logged_peak_bytes(two)) - 0.3 * state_bytes)
      << "ZeRO-1 should hold about half the optimizer state on rank 0";
  // ZeRO-2 (gradients summed into their owners; one micro-batch, so the same sums): bitwise too.
  const fs::path z2 = tmp.path() / "z2";
  run_ok(mpirun_command(2, "full_finetune_distributed", "demo/tiny_full",
                        run_overrides(z2, corpus, 2,
                                      {{"zero_stage", "2"}, {"log_peak_memory_stats", "true"}})),
         tmp.path() / "s_z2");
  EXPECT_EQ(losses_of(logged_steps(z2)), got);
  for (const char* f : {"epoch_0/model.safetensors", "epoch_0/recipe_state.safetensors"})
    EXPECT_EQ(read_text(z2 / f), read_text(two / f)) << f;
  // ZeRO-3 (each parameter broadcast from its owner when used: the same bits): bitwise too,
  // the checkpoint gathered to rank 0 included, with about half the parameters on rank 0
  // between uses.
  const fs::path z3 = tmp.path() / "z3";
  run_ok(mpirun_command(2, "full_finetune_distributed", "demo/tiny_full",
                        run_overrides(z3, corpus, 2,
                                      {{"zero_stage", "3"}, {"log_peak_memory_stats", "true"}})),
         tmp.path() / "s_z3");
  EXPECT_EQ(losses_of(logged_steps(z3)), got);
  for (const char* f : {"epoch_0/model.safetensors", "epoch_0/recipe_state.safetensors",
                        "step_5/model.safetensors", "step_5/recipe_state.safetensors"})
    EXPECT_EQ(read_text(z3 / f), read_text(two / f)) << f;
  // The gathered parameters land in reused buffers: the first step allocates them, the next
  // ones (until the checkpoint at step 5 frees the idle ones) none.
  const std::vector<double> fresh = logged_values(z3, "gather_new_buffers");
  ASSERT_GE(fresh.size(), 5u);
  EXPECT_GT(fresh[0], 0);
  for (size_t i = 1; i < 5; ++i) EXPECT_EQ(fresh[i], 0) << "step " << i + 1;
  const double model_bytes = double(fs::file_size(two / "epoch_0" / "model.safetensors"));
  EXPECT_LT(double(logged_peak_bytes(z3)), double(logged_peak_bytes(z2)) - 0.2 * model_bytes)
      << "ZeRO-3 should hold about half the parameters on rank 0";
  // Resume the ZeRO-3 run's step_5 with one process (the distributed recipe started plainly),
  // and the 1-process run's step_5 with 2 ranks at ZeRO-3 (compiled: true): both continue the
  // reference curve.
  const fs::path to_one = tmp.path() / "to_one", to_two = tmp.path() / "to_two";
  fs::create_directories(to_one);
  fs::create_directories(to_two);
  fs::copy(z3 / "step_5", to_one / "step_5", fs::copy_options::recursive);
  fs::copy(ref / "step_5", to_two / "step_5", fs::copy_options::recursive);
  run_ok(run_command("full_finetune_distributed", "demo/tiny_full",
                     run_overrides(to_one, corpus, 4, {{"resume_from_checkpoint", "true"}})),
         tmp.path() / "s_to_one");
  run_ok(mpirun_command(
             2, "full_finetune_distributed", "demo/tiny_full",
             run_overrides(
                 to_two, corpus, 2,
                 {{"resume_from_checkpoint", "true"}, {"zero_stage", "3"}, {"compile", "true"}})),
         tmp.path() / "s_to_two");
  expect_same_curve(losses_of(logged_steps(to_one)), tail(want, 5), "resumed 2 -> 1 rank");
  expect_same_curve(losses_of(logged_steps(to_two)), tail(want, 5),
                    "resumed 1 -> 2 ranks at ZeRO-3, compile: true");
}

TEST(DistTraining, LoraZero2OverTcpAndZero3TwoRanksMatchOneProcess) {
  FT_REQUIRE_MPIRUN();
  const TempDir tmp;
  const fs::path corpus = write_uneven_corpus(tmp.path());
  Overrides lora = kLora;
  lora["gradient_accumulation_steps"] = "2";  // the global count spans micro-batches too
  lora["max_steps_per_epoch"] = "5";
  const fs::path ref = tmp.path() / "ref";
  run_ok(run_command("lora_finetune_single_device", "demo/tiny_full",
                     run_overrides(ref, corpus, 4, lora)),
         tmp.path() / "s_ref");
  const std::vector<double> want = losses_of(logged_steps(ref));
  ASSERT_EQ(want.size(), 5u);
  // As between hosts: TCP only (no shared memory transport).
  // ZeRO-2: each micro-batch's gradients summed into their owners, accumulated there.
  lora["zero_stage"] = "2";
  const fs::path two = tmp.path() / "two";
  run_ok(mpirun_command(2, "lora_finetune_distributed", "demo/tiny_full",
                        run_overrides(two, corpus, 2, lora), "--mca btl tcp,self"),
         tmp.path() / "s_two");
  expect_same_curve(losses_of(logged_steps(two)), want, "LoRA 2 ranks x 2 over TCP vs 1 x 4");
  EXPECT_TRUE(fs::exists(two / "epoch_0" / "adapter_model.safetensors"));
  // ZeRO-3: the frozen base sharded too; compile: model, and the gathered parameters kept
  // from the forward to the backward.
  lora["zero_stage"] = "3";
  lora["compile"] = "model";
  lora["fsdp_reshard_after_forward"] = "false";
  const fs::path z3 = tmp.path() / "z3";
  run_ok(mpirun_command(2, "lora_finetune_distributed", "demo/tiny_full",
                        run_overrides(z3, corpus, 2, lora)),
         tmp.path() / "s_z3");
  expect_same_curve(losses_of(logged_steps(z3)), want, "LoRA ZeRO-3 2 ranks x 2 vs 1 x 4");
  EXPECT_TRUE(fs::exists(z3 / "epoch_0" / "adapter_model.safetensors"));
}

// overlap_grad_allreduce: the gradients summed in buckets during the last micro-batch's backward
// (a communication thread) against all of them after the backward: bitwise the same losses and
// weights, with bf16 gradients (summed in fp32 buckets), 2 micro-batches (the first one's
// gradients added in before a bucket is packed) and buckets of 64Ki elements (bucket_cap_mb
// 0.25): the embedding and output gradients (128Ki elements each) go through the bucket space in
// pieces, and the layers' gradients (92Ki elements) fill more than one bucket.
TEST(DistTraining, OverlappedGradientSumIsBitwiseTheSumAfterTheBackward) {
  FT_REQUIRE_MPIRUN();
  const TempDir tmp;
  const fs::path corpus = write_uneven_corpus(tmp.path());
  const Overrides extra = {{"dtype", "bf16"},
                           {"gradient_accumulation_steps", "2"},
                           {"model.vocab_size", "2048"},
                           {"bucket_cap_mb", "0.25"},
                           {"save_every_n_steps", "100"}};
  std::vector<double> losses[2];
  std::string weights[2];
  for (int overlap = 0; overlap < 2; ++overlap) {
    Overrides o = rank_run_overrides(tmp.path() / std::to_string(overlap), corpus, 2, 4, extra);
    o["overlap_grad_allreduce"] = overlap ? "true" : "false";
    const CliRun r = run_shell(mpirun_command(2, "full_finetune_distributed", "demo/tiny_full", o),
                               tmp.path() / ("s" + std::to_string(overlap)));
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_EQ(r.out.find("overlap_grad_allreduce: from step 2 the gradients are summed in 4 "
                         "collectives") != std::string::npos,
              overlap == 1)
        << r.out;
    losses[overlap] = losses_of(logged_steps(tmp.path() / std::to_string(overlap)));
    weights[overlap] =
        read_text(tmp.path() / std::to_string(overlap) / "epoch_0" / "model.safetensors");
  }
  ASSERT_EQ(losses[0].size(), 4u);
  EXPECT_EQ(losses[1], losses[0]);
  EXPECT_FALSE(weights[0].empty());
  EXPECT_TRUE(weights[1] == weights[0]) << "the streamed run's weights differ";
}

// Validation over ranks: 5 validation samples in batches of 2 (3 batches: 2 on rank 0, 1 on
// rank 1); the loss sums and units are all-reduced, so the logged val_loss is the one-process
// value. At ZeRO-3 rank 1 runs one forward more (discarded) to join the parameter broadcasts.
TEST(DistTraining, ShardedValidationMatchesOneProcessWithAnOddSampleCount) {
  FT_REQUIRE_MPIRUN();
  const TempDir tmp;
  const fs::path corpus = write_uneven_corpus(tmp.path());
  const Overrides val = {{"dataset_val._component_", "text_completion"},
                         {"dataset_val.source", corpus.string()},
                         {"dataset_val.split", "train[:5]"},
                         {"dataset_val.packed", "false"},
                         {"batch_size_val", "2"},
                         {"run_val_every_n_steps", "1"}};
  const fs::path ref = tmp.path() / "ref";
  run_ok(run_command("full_finetune_single_device", "demo/tiny_full",
                     rank_run_overrides(ref, corpus, 4, 3, val)),
         tmp.path() / "s_ref");
  const std::vector<double> want = logged_values(ref, "val_loss");
  ASSERT_EQ(want.size(), 3u);
  for (const std::string stage : {"0", "3"}) {
    Overrides o = val;
    o["zero_stage"] = stage;
    const fs::path two = tmp.path() / ("two_z" + stage);
    run_ok(mpirun_command(2, "full_finetune_distributed", "demo/tiny_full",
                          rank_run_overrides(two, corpus, 2, 3, o)),
           tmp.path() / ("s_two_z" + stage));
    const std::vector<double> got = logged_values(two, "val_loss");
    ASSERT_EQ(got.size(), want.size()) << "zero_stage " << stage;
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_LE(std::abs(got[i] - want[i]), 1e-6 * std::abs(want[i]))
          << "zero_stage " << stage << ", validation " << i << ": " << got[i] << " vs " << want[i];
  }
}

TEST(DistTraining, LaunchAndConfigErrorsAreClear) {
  const TempDir tmp;
  auto run = [&](const std::string& args) {
    return run_shell(shell_quote(binary_path()) + " " + args, tmp.path() / "s");
  };
  CliRun r = run("run --nproc_per_node 2 full_finetune_single_device --config demo/tiny_full");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--nproc_per_node runs a *_distributed recipe"), std::string::npos) << r.err;
  r = run("run --nproc_per_node two full_finetune_distributed --config demo/tiny_full");
  EXPECT_NE(r.err.find("--nproc_per_node must be a whole number >= 1, got 'two'"),
            std::string::npos)
      << r.err;
  r = run("validate demo/tiny_full --recipe full_finetune_distributed zero_stage=4");
  EXPECT_NE(r.code, 0);
  EXPECT_NE((r.out + r.err).find("zero_stage"), std::string::npos) << r.out << r.err;
  // Refused before any rank starts, not at the first gradient of the first backward.
  r = run("validate demo/tiny_full --recipe full_finetune_distributed zero_stage=2 dtype=bf16");
  EXPECT_NE(r.code, 0);
  EXPECT_NE((r.out + r.err).find("zero_stage 2 sums fp32 gradients only, and dtype is bf16"),
            std::string::npos)
      << r.out << r.err;
}
