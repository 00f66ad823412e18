// QLoRA at ZeRO-3 over MPI (2 ranks x 1 thread): the NF4 base is sharded with the other frozen
// parameters and broadcast packed when used, so the losses and checkpoints are bitwise those of
// stage 0, and rank 0's step peak falls by about half the NF4 base against stage 2.
#include <gtest/gtest.h>

#include <filesystem>

#include "mpi_runs.h"
#include "recipe_runs.h"
#include "test_support.h"

using namespace fusetune::testing;
namespace fs = std::filesystem;

namespace {

// 4 layers of width 128: the NF4 base (~0.4 MB) is much bigger than the adapters, so the
// stage-3 saving shows the base sharded.
constexpr int64_t kHidden = 128, kInter = 352, kLayers = 4, kKv = 32, kVocab = 259;

Overrides qlora_overrides(const fs::path& out, const fs::path& corpus, int batch,
                          const Overrides& extra = {}) {
  Overrides o = rank_run_overrides(out, corpus, batch, 3,
                                   {{"model.quantize_base", "true"},
                                    {"model.lora_attn_modules", "[q_proj,v_proj]"},
                                    {"model.apply_lora_to_mlp", "true"},
                                    {"model.lora_rank", "4"},
                                    {"model.hidden_size", std::to_string(kHidden)},
                                    {"model.intermediate_size", std::to_string(kInter)},
                                    {"model.num_hidden_layers", std::to_string(kLayers)},
                                    {"model.num_attention_heads", "8"},
                                    {"model.num_key_value_heads", "2"}});
  for (const auto& [k, v] : extra) o[k] = v;
  return o;
}

// The packed NF4 base: 4 bits per element plus a byte of absmax code per 64-element block.
double nf4_base_bytes() {
  const int64_t per_layer =
      2 * kHidden * kHidden + 2 * kHidden * kKv + 3 * kHidden * kInter;  // q, o; k, v; the MLP
  const int64_t numel = kLayers * per_layer + 2 * kVocab * kHidden;      // + embedding, lm_head
  return double(numel) * (0.5 + 1.0 / 64);
}

}  // namespace

TEST(DistQLoRA, Zero3ShardsTheNF4BaseBitwiseStageZeroWithLessMemory) {
  FT_REQUIRE_MPIRUN();
  const TempDir tmp;
  const fs::path corpus = write_uneven_corpus(tmp.path());
  auto ranks = [&](const std::string& name, const Overrides& extra) {
    const fs::path out = tmp.path() / name;
    run_ok(mpirun_command(2, "lora_finetune_distributed", "demo/tiny_full",
                          qlora_overrides(out, corpus, 2, extra)),
           tmp.path() / ("s_" + name));
    return out;
  };
  const fs::path ref = tmp.path() / "ref";
  run_ok(
      run_command("lora_finetune_single_device", "demo/tiny_full", qlora_overrides(ref, corpus, 4)),
      tmp.path() / "s_ref");
  const std::vector<double> want = losses_of(logged_steps(ref));
  ASSERT_EQ(want.size(), 3u);

  const fs::path z0 = ranks("z0", {});
  const std::vector<double> got = losses_of(logged_steps(z0));
  expect_same_curve(got, want, "QLoRA 2 ranks x 2 vs 1 x 4");
  const fs::path z2 = ranks("z2", {{"zero_stage", "2"}, {"log_peak_memory_stats", "true"}});
  EXPECT_EQ(losses_of(logged_steps(z2)), got);
  // Stage 3, the base gathered for the forward and again for the backward: bitwise stage 0,
  // the merged checkpoint (the base gathered to rank 0 and dequantized) included.
  const fs::path z3 = ranks("z3", {{"zero_stage", "3"}, {"log_peak_memory_stats", "true"}});
  EXPECT_EQ(losses_of(logged_steps(z3)), got);
  for (const char* f : {"epoch_0/adapter_model.safetensors", "epoch_0/model.safetensors"})
    EXPECT_EQ(read_text(z3 / f), read_text(z0 / f)) << f;
  const double saved = double(logged_peak_bytes(z2) - logged_peak_bytes(z3));
  EXPECT_GT(saved, 0.3 * nf4_base_bytes())
      << "rank 0's peak: stage 2 " << logged_peak_bytes(z2) << " B, stage 3 "
      << logged_peak_bytes(z3) << " B; NF4 base " << nf4_base_bytes() << " B";
  // compile: model, the gathered base kept from the forward to the backward.
  const fs::path z3m = ranks(
      "z3m", {{"zero_stage", "3"}, {"compile", "model"}, {"fsdp_reshard_after_forward", "false"}});
  expect_same_curve(losses_of(logged_steps(z3m)), want, "QLoRA ZeRO-3, compile: model");
  // compile: true (the fused NF4 head), adapter-only checkpoints: bitwise its stage-0 run.
  const Overrides compiled = {{"compile", "true"}, {"save_adapter_weights_only", "true"}};
  const fs::path z0c = ranks("z0c", compiled);
  Overrides z3_compiled = compiled;
  z3_compiled["zero_stage"] = "3";
  const fs::path z3c = ranks("z3c", z3_compiled);
  EXPECT_EQ(losses_of(logged_steps(z3c)), losses_of(logged_steps(z0c)));
  EXPECT_EQ(read_text(z3c / "epoch_0" / "adapter_model.safetensors"),
            read_text(z0c / "epoch_0" / "adapter_model.safetensors"));
  EXPECT_FALSE(fs::exists(z3c / "epoch_0" / "model.safetensors"));
}
