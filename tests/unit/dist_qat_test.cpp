// The data-parallel QAT recipes (qat_distributed, qat_lora_finetune_distributed) over MPI, 2
// ranks x 1 thread: 2 ranks x batch b give the losses of one process x 2b with fake
// quantization on (fp32, relative 1e-5), fake_quant_after_n_steps switches every rank at the
// same step, a rerun is bitwise identical, and the checkpoint rank 0 writes is what
// `fusetune quantize` and `fusetune export --format gguf` take. The references are the
// single-device QAT recipes.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "mpi_runs.h"
#include "recipe_runs.h"
#include "test_support.h"

using namespace fusetune::testing;
namespace fs = std::filesystem;

namespace {

// stories260K (real tokenizer, tied embedding: the gguf_q4_0 head and embedding are Q8_0) on
// the uneven corpus, `batch` rows per rank, 8 steps.
Overrides stories_overrides(const fs::path& out, const fs::path& corpus, int batch,
                            const Overrides& extra = {}) {
  const fs::path a = assets_dir();
  Overrides o =
      rank_run_overrides(out, corpus, batch, 8,
                         {{"checkpointer.checkpoint_dir", (a / "stories260K").string()},
                          {"tokenizer.path", (a / "stories260K" / "tokenizer.json").string()},
                          {"lr_scheduler.num_warmup_steps", "2"}});
  for (const auto& [k, v] : extra) o[k] = v;
  return o;
}

}  // namespace

TEST(DistQat, GgufQ4_0SwitchedOnMidRunTwoRanksZero1MatchOneProcessZero3RerunBitwiseAndExport) {
  FT_REQUIRE_MPIRUN();
  FT_REQUIRE_ASSET("stories260K/model.safetensors");
  const TempDir tmp;
  const fs::path corpus = write_uneven_corpus(tmp.path());
  const std::string config = "stories260K/qat_single_device";  // gguf_q4_0, compile: true
  const Overrides qat = {{"fake_quant_after_n_steps", "3"}};
  // Float training (the same config without its quantizer): steps 1-3 of the QAT runs.
  const fs::path plain = tmp.path() / "plain";
  run_ok(run_command("full_finetune_single_device", config,
                     stories_overrides(plain, corpus, 4,
                                       {{"~quantizer", ""}, {"~fake_quant_after_n_steps", ""}})),
         tmp.path() / "s_plain");
  const fs::path ref = tmp.path() / "ref";
  run_ok(run_command("qat_single_device", config, stories_overrides(ref, corpus, 4, qat)),
         tmp.path() / "s_ref");
  const std::vector<double> want = losses_of(logged_steps(ref)),
                            floats = losses_of(logged_steps(plain));
  ASSERT_EQ(want.size(), 8u);
  ASSERT_EQ(floats.size(), 8u);
  // (Not bitwise: under compile: true the float head fuses with the cross-entropy, the
  // switchable fake-quantized one does not.)
  for (size_t i = 0; i < 3; ++i)
    EXPECT_LE(std::abs(want[i] - floats[i]), 1e-5 * std::abs(floats[i])) << "step " << i + 1;
  // From step 4 the weights are fake-quantized: far more than the tolerance below apart.
  EXPECT_GT(std::abs(want[3] - floats[3]), 1e-3 * std::abs(floats[3]));

  // 2 ranks x 2, ZeRO-1.
  Overrides two_ranks = qat;
  two_ranks["zero_stage"] = "1";
  const fs::path two = tmp.path() / "two";
  run_ok(mpirun_command(2, "qat_distributed", config, stories_overrides(two, corpus, 2, two_ranks)),
         tmp.path() / "s_two");
  const std::vector<double> got = losses_of(logged_steps(two));
  // Against one process x 4: the same to 1e-5 up to the switch. Two ranks sum the gradients
  // in another order than one batch of 4 (~1e-7 apart); once fake quantization is on, such a
  // difference sooner or later moves a weight or an activation across a Q4_0/Q8_0 rounding
  // boundary and the runs part by a whole quantization step (printed below), as two
  // single-process runs with the same data in another order would.
  expect_same_curve(std::vector<double>(got.begin(), got.begin() + 4),
                    std::vector<double>(want.begin(), want.begin() + 4),
                    "qat_distributed 2 ranks x 2 vs qat_single_device 1 x 4, steps 1-4");
  for (size_t i = 0; i < got.size() && i < want.size(); ++i)
    std::printf("step %zu: 2 ranks x 2 %.9f, 1 x 4 %.9f, relative difference %.2g\n", i + 1, got[i],
                want[i], std::abs(got[i] - want[i]) / std::abs(want[i]));
  // Against one process x 2 with gradient_accumulation_steps 2, which sums the same two
  // micro-batch gradients (a + b = b + a): bitwise, every step, fake quantization on or off.
  // So the ranks normalize, reduce and switch fake quantization on exactly as one process.
  const fs::path acc = tmp.path() / "acc";
  Overrides accumulate = qat;
  accumulate["gradient_accumulation_steps"] = "2";
  run_ok(run_command("qat_single_device", config, stories_overrides(acc, corpus, 2, accumulate)),
         tmp.path() / "s_acc");
  EXPECT_EQ(got, losses_of(logged_steps(acc)));
  EXPECT_EQ(read_text(acc / "epoch_0" / "model.safetensors"),
            read_text(two / "epoch_0" / "model.safetensors"));
  // A rerun at ZeRO-3 (parameters sharded, each broadcast from its owner where it is used):
  // bitwise the same losses and weights, so the run is deterministic and stage 3 moves only
  // bits, fake-quantized layers and head included.
  const fs::path again = tmp.path() / "again";
  Overrides zero3 = two_ranks;
  zero3["zero_stage"] = "3";
  run_ok(mpirun_command(2, "qat_distributed", config, stories_overrides(again, corpus, 2, zero3)),
         tmp.path() / "s_again");
  EXPECT_EQ(losses_of(logged_steps(again)), got);
  EXPECT_EQ(read_text(again / "epoch_0" / "model.safetensors"),
            read_text(two / "epoch_0" / "model.safetensors"));

  // Rank 0's checkpoint (float weights and the tokenizer files) is what quantize and export
  // take.
  const std::string ck = shell_quote((two / "epoch_0").string());
  const std::string bin = shell_quote(binary_path());
  run_ok(bin + " quantize --type q4_0 --output " + shell_quote((tmp.path() / "q4").string()) + " " +
             ck,
         tmp.path() / "s_quantize");
  EXPECT_TRUE(fs::exists(tmp.path() / "q4" / "model.safetensors"));
  const fs::path gguf = tmp.path() / "m.gguf";
  run_ok(
      bin + " export --format gguf --type q4_0 --output " + shell_quote(gguf.string()) + " " + ck,
      tmp.path() / "s_export");
  EXPECT_EQ(read_text(gguf).substr(0, 4), "GGUF");
}

TEST(DistQat, LoraInt8DynActInt4Zero2WithAccumulationTwoRanksMatchOneProcess) {
  FT_REQUIRE_MPIRUN();
  const TempDir tmp;
  const fs::path corpus = write_uneven_corpus(tmp.path());
  const Overrides lora = {{"gradient_accumulation_steps", "2"},
                          {"optimizer.lr", "1e-2"},
                          {"quantizer._component_", "Int8DynActInt4WeightQATQuantizer"},
                          {"quantizer.groupsize", "32"},
                          {"model.lora_attn_modules", "[q_proj,v_proj]"},
                          {"model.apply_lora_to_mlp", "true"},
                          {"model.lora_rank", "4"},
                          {"model.lora_alpha", "8"}};
  auto overrides = [&](const fs::path& out, int batch, const Overrides& extra) {
    Overrides o = rank_run_overrides(out, corpus, batch, 5, lora);
    for (const auto& [k, v] : extra) o[k] = v;
    return o;
  };
  const fs::path ref = tmp.path() / "ref";
  run_ok(run_command("qat_lora_finetune_single_device", "demo/tiny_full", overrides(ref, 4, {})),
         tmp.path() / "s_ref");
  const std::vector<double> want = losses_of(logged_steps(ref));
  ASSERT_EQ(want.size(), 5u);
  EXPECT_LT(want.back(), want.front());
  // ZeRO-2: each micro-batch's adapter gradients summed into their owners.
  const fs::path two = tmp.path() / "two";
  const CliRun r = run_shell(mpirun_command(2, "qat_lora_finetune_distributed", "demo/tiny_full",
                                            overrides(two, 2, {{"zero_stage", "2"}})),
                             tmp.path() / "s_two");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("ranks:            2 (data parallel; global batch 4)"), std::string::npos)
      << r.out;
  const std::vector<double> got = losses_of(logged_steps(two));
  expect_same_curve(got, want, "qat_lora_finetune_distributed 2 ranks x 2 vs 1 x 4");
  double worst = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i)
    worst = std::max(worst, std::abs(got[i] - want[i]) / std::abs(want[i]));
  std::printf(
      "qat_lora_finetune_distributed (Int8DynActInt4, ZeRO-2, accumulation 2): largest "
      "relative loss difference to one process: %.3g\n",
      worst);
  EXPECT_TRUE(fs::exists(two / "epoch_0" / "adapter_model.safetensors"));
}

// The distributed keys as the other *_distributed recipes treat them, the QAT keys as the
// single-device QAT recipes, and `fusetune ls` / `plan` know the recipes.
TEST(DistQat, ConfigKeysLsAndPlan) {
  const TempDir tmp;
  auto run = [&](const std::string& args) {
    return run_shell(shell_quote(binary_path()) + " " + args, tmp.path() / "s");
  };
  const std::string q8 = " quantizer._component_=gguf_q8_0 fake_quant_after_n_steps=2";
  CliRun r =
      run("validate demo/tiny_full --recipe qat_distributed zero_stage=2 "
          "dist_timeout_seconds=60 fsdp_cpu_offload=true fsdp_reshard_after_forward=true" +
          q8);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE((r.out + r.err).find("fsdp_cpu_offload: true changes nothing"), std::string::npos)
      << r.out << r.err;
  for (const char* bad : {"zero_stage=4", "'custom_sharded_layers=[tok_embeddings]'",
                          "fake_quant_after_n_steps=-1"}) {
    r = run("validate demo/tiny_full --recipe qat_distributed" + q8 + " " + bad);
    EXPECT_NE(r.code, 0) << bad << "\n" << r.out << r.err;
  }
  r = run("validate demo/tiny_full --recipe qat_distributed");
  EXPECT_NE(r.code, 0);
  EXPECT_NE((r.out + r.err).find("quantizer"), std::string::npos) << r.out << r.err;
  r =
      run("validate demo/tiny_full --recipe qat_lora_finetune_distributed "
          "'model.lora_attn_modules=[q_proj]' model.quantize_base=true zero_stage=1" +
          q8);
  EXPECT_NE(r.code, 0);
  EXPECT_NE((r.out + r.err).find("fake-quantizes a float base"), std::string::npos)
      << r.out << r.err;

  r = run("ls");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* name : {"qat_distributed", "qat_lora_finetune_distributed",
                           "llama3_2/3B_qat_full", "llama3_2/1B_qat_lora"})
    EXPECT_NE(r.out.find(name), std::string::npos) << name << "\n" << r.out;

  // The plan of a rank's step is the single-device QAT step (with its fake-quantization
  // kernels), not full fine-tuning's.
  auto kernels = [&](const std::string& recipe, const std::string& keys) {
    const CliRun p = run("plan --config demo/tiny_full --recipe " + recipe + keys);
    EXPECT_EQ(p.code, 0) << p.out << p.err;
    const size_t at = p.out.find("kernels: ");
    return at == std::string::npos ? std::string() : p.out.substr(at, p.out.find('\n', at) - at);
  };
  const std::string qat_dist = kernels("qat_distributed", q8);
  EXPECT_FALSE(qat_dist.empty());
  EXPECT_EQ(qat_dist, kernels("qat_single_device", q8));
  EXPECT_NE(qat_dist, kernels("full_finetune_distributed", ""));
}
