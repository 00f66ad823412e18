// The resume matrix: every training recipe x {fp32, bf16} x {one process; 2 ranks for the
// distributed ones} trains 2 epochs of 2 steps with a checkpoint after every step, then a second
// run starts from a copy of step_1 alone. The resumed run must log bitwise the uninterrupted
// run's loss, lr and grad_norm for steps 2-4 (across the epoch boundary) and end with bitwise
// its epoch_1 tensor files: weights, adapters, optimizer state. The tiny model keeps each case
// to a few seconds; LoRA rows use dropout (its seed must continue), QAT rows switch fake
// quantization on at step 2 (in the resumed part). bf16 distributed rows are at ZeRO 0/1 (2-3
// refuse bf16).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "metrics_log.h"
#include "resume_runs.h"

using namespace fusetune::testing;
namespace fs = std::filesystem;

namespace {

enum class Model { Full, Lora, FromCheckpoint };

struct Case {
  const char* name;
  const char* recipe;
  int ranks;  // 1: one process; 2: mpirun -np 2
  TinyData data;
  Model model;
  Overrides extra;  // dtype, zero_stage, the variant's keys
};

// gtest prints a failing case's parameter: its name.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

const Overrides kLora = {{"model.lora_attn_modules", "[q_proj,v_proj]"},
                         {"model.apply_lora_to_mlp", "true"},
                         {"model.lora_rank", "8"},
                         {"model.lora_alpha", "16"},
                         {"model.lora_dropout", "0.1"}};
const Overrides kQat = {{"quantizer._component_", "Int8DynActInt4WeightQATQuantizer"},
                        {"quantizer.groupsize", "32"},
                        {"fake_quant_after_n_steps", "1"}};

const Overrides kFp32 = {{"dtype", "fp32"}}, kBf16 = {{"dtype", "bf16"}};

const std::vector<Case>& cases() {
  using D = TinyData;
  static const std::vector<Case> all = {
      // One process.
      {"full_fp32", "full_finetune_single_device", 1, D::Text, Model::Full, kFp32},
      {"full_bf16", "full_finetune_single_device", 1, D::Text, Model::Full, kBf16},
      {"full_bf16_bf16state", "full_finetune_single_device", 1, D::Text, Model::Full,
       with_keys(kBf16, {{"optimizer.state_dtype", "bf16"}})},
      {"lora_fp32", "lora_finetune_single_device", 1, D::Text, Model::Lora, kFp32},
      {"lora_bf16", "lora_finetune_single_device", 1, D::Text, Model::Lora, kBf16},
      {"lora_bf16_bf16state", "lora_finetune_single_device", 1, D::Text, Model::Lora,
       with_keys(kBf16, {{"optimizer.state_dtype", "bf16"}})},
      {"dora_fp32", "lora_finetune_single_device", 1, D::Text, Model::Lora,
       with_keys(kFp32, {{"model.use_dora", "true"}})},
      {"dora_bf16", "lora_finetune_single_device", 1, D::Text, Model::Lora,
       with_keys(kBf16, {{"model.use_dora", "true"}})},
      {"qlora_fp32", "lora_finetune_single_device", 1, D::Text, Model::Lora,
       with_keys(kFp32, {{"model.quantize_base", "true"}})},
      {"qlora_bf16", "lora_finetune_single_device", 1, D::Text, Model::Lora,
       with_keys(kBf16, {{"model.quantize_base", "true"}})},
      {"lora_adapter_only_fp32", "lora_finetune_single_device", 1, D::Text, Model::Lora,
       with_keys(kFp32, {{"save_adapter_weights_only", "true"}})},
      {"lora_adapter_only_bf16", "lora_finetune_single_device", 1, D::Text, Model::Lora,
       with_keys(kBf16, {{"save_adapter_weights_only", "true"}})},
      {"lora_dpo_fp32", "lora_dpo_single_device", 1, D::Pairs, Model::Lora, kFp32},
      {"lora_dpo_bf16", "lora_dpo_single_device", 1, D::Pairs, Model::Lora, kBf16},
      {"full_dpo_fp32", "full_dpo_single_device", 1, D::Pairs, Model::FromCheckpoint, kFp32},
      {"full_dpo_bf16", "full_dpo_single_device", 1, D::Pairs, Model::FromCheckpoint, kBf16},
      {"qat_fp32", "qat_single_device", 1, D::Text, Model::Full, with_keys(kFp32, kQat)},
      {"qat_bf16", "qat_single_device", 1, D::Text, Model::Full, with_keys(kBf16, kQat)},
      {"qat_lora_fp32", "qat_lora_finetune_single_device", 1, D::Text, Model::Lora,
       with_keys(kFp32, kQat)},
      {"qat_lora_bf16", "qat_lora_finetune_single_device", 1, D::Text, Model::Lora,
       with_keys(kBf16, kQat)},
      // 2 ranks: fp32 over the ZeRO stages, bf16 at 0/1.
      {"full_dist_fp32_zero3", "full_finetune_distributed", 2, D::Text, Model::Full,
       with_keys(kFp32, {{"zero_stage", "3"}})},
      {"full_dist_bf16_zero1", "full_finetune_distributed", 2, D::Text, Model::Full,
       with_keys(kBf16, {{"zero_stage", "1"}})},
      {"lora_dist_fp32_zero2", "lora_finetune_distributed", 2, D::Text, Model::Lora,
       with_keys(kFp32, {{"zero_stage", "2"}})},
      {"lora_dist_bf16_zero1", "lora_finetune_distributed", 2, D::Text, Model::Lora,
       with_keys(kBf16, {{"zero_stage", "1"}})},
      {"qlora_dist_bf16_zero0", "lora_finetune_distributed", 2, D::Text, Model::Lora,
       with_keys(kBf16, {{"zero_stage", "0"}, {"model.quantize_base", "true"}})},
      {"qat_dist_fp32_zero1", "qat_distributed", 2, D::Text, Model::Full,
       with_keys(with_keys(kFp32, kQat), {{"zero_stage", "1"}})},
      {"qat_dist_bf16_zero0", "qat_distributed", 2, D::Text, Model::Full,
       with_keys(with_keys(kBf16, kQat), {{"zero_stage", "0"}})},
      {"qat_lora_dist_fp32_zero3", "qat_lora_finetune_distributed", 2, D::Text, Model::Lora,
       with_keys(with_keys(kFp32, kQat), {{"zero_stage", "3"}})},
      {"qat_lora_dist_bf16_zero1", "qat_lora_finetune_distributed", 2, D::Text, Model::Lora,
       with_keys(with_keys(kBf16, kQat), {{"zero_stage", "1"}})},
      {"lora_dpo_dist_fp32_zero2", "lora_dpo_distributed", 2, D::Pairs, Model::Lora,
       with_keys(kFp32, {{"zero_stage", "2"}})},
      {"lora_dpo_dist_bf16_zero1", "lora_dpo_distributed", 2, D::Pairs, Model::Lora,
       with_keys(kBf16, {{"zero_stage", "1"}})},
      {"full_dpo_dist_fp32_zero3", "full_dpo_distributed", 2, D::Pairs, Model::FromCheckpoint,
       with_keys(kFp32, {{"zero_stage", "3"}})},
      {"full_dpo_dist_bf16_zero0", "full_dpo_distributed", 2, D::Pairs, Model::FromCheckpoint,
       with_keys(kBf16, {{"zero_stage", "0"}})},
  };
  return all;
}

// The logged values a resumed step must repeat exactly (the DPO ones when logged).
const char* const kCompared[] = {
    "loss", "lr", "grad_norm", "rewards/chosen", "rewards/rejected", "rewards/margins"};

// Each logged training step's compared values, by step.
std::map<int64_t, nlohmann::json> logged(const fs::path& out) {
  std::map<int64_t, nlohmann::json> steps;
  for (const nlohmann::json& j : metrics_lines(out)) {
    if (!j.contains("loss")) continue;
    nlohmann::json kept;
    for (const char* k : kCompared)
      if (j.contains(k)) kept[k] = j.at(k);
    steps[j.at("step").get<int64_t>()] = kept;
  }
  return steps;
}

class ResumeMatrix : public ::testing::TestWithParam<Case> {};

TEST_P(ResumeMatrix, ResumedRunIsBitwiseTheUninterruptedOne) {
  const Case& c = GetParam();
  if (c.ranks > 1) FT_REQUIRE_MPIRUN();
  const auto t0 = std::chrono::steady_clock::now();
  const TempDir tmp;
  const fs::path source = c.data == TinyData::Text
                              ? fs::path(source_dir()) / "configs/demo/demo_corpus.txt"
                              : write_tiny_pairs(tmp.path());
  fs::path checkpoint;
  if (c.model == Model::FromCheckpoint) {
    checkpoint = write_tiny_checkpoint(tmp / "init", 64, 128);
    ASSERT_FALSE(checkpoint.empty());
  }
  const fs::path config = tmp / "config.yaml";
  write_text(config, tiny_run_yaml(c.data, source, checkpoint));
  // 2 epochs x 2 steps, checkpoints step_1, epoch_0 (step 2), step_3, epoch_1 (step 4).
  Overrides o = {{"epochs", "2"}, {"max_steps_per_epoch", "2"}, {"save_every_n_steps", "1"}};
  if (c.model == Model::Lora) o = with_keys(o, kLora);
  o = with_keys(o, c.extra);

  const fs::path whole = tmp / "whole";
  o["output_dir"] = whole.string();
  const CliRun w = run_recipe(c.ranks, c.recipe, config, o, tmp / "io_whole");
  ASSERT_EQ(w.code, 0) << w.out << w.err;
  const auto want = logged(whole);
  ASSERT_EQ(want.size(), 4u) << w.out;
  ASSERT_TRUE(fs::exists(whole / "step_1" / "recipe_state.json"));

  const fs::path resumed = tmp / "resumed";
  fs::create_directories(resumed);
  fs::copy(whole / "step_1", resumed / "step_1", fs::copy_options::recursive);
  o["output_dir"] = resumed.string();
  o["resume_from_checkpoint"] = "true";
  const CliRun r = run_recipe(c.ranks, c.recipe, config, o, tmp / "io_resumed");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("resumed_from"), std::string::npos) << r.out;
  const auto got = logged(resumed);
  ASSERT_EQ(got.size(), 3u) << r.out;
  for (const auto& [step, values] : got) {
    ASSERT_TRUE(want.count(step)) << "step " << step;
    EXPECT_EQ(values.dump(), want.at(step).dump()) << c.name << ": step " << step;
  }
  EXPECT_EQ(got.begin()->first, 2);
  expect_same_tensor_files(resumed / "epoch_1", whole / "epoch_1", c.name);
  std::printf("%s: %.1f s\n", c.name,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

INSTANTIATE_TEST_SUITE_P(Recipes, ResumeMatrix, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace

// checkpointer.adapter_checkpoint (a run starting from a saved PEFT adapter) reads the fp32
// file into the run's dtype too: a bf16 run at lr 0 saves bitwise the adapter it started from.
TEST(AdapterCheckpoint, Bf16RunStartsFromTheSavedAdapterExactly) {
  const auto t0 = std::chrono::steady_clock::now();
  const TempDir tmp;
  const fs::path config = tmp / "config.yaml";
  write_text(config, tiny_run_yaml(TinyData::Text,
                                   fs::path(source_dir()) / "configs/demo/demo_corpus.txt"));
  Overrides o = with_keys(
      kLora,
      {{"dtype", "bf16"}, {"max_steps_per_epoch", "2"}, {"output_dir", (tmp / "first").string()}});
  const CliRun a = run_recipe(1, "lora_finetune_single_device", config, o, tmp / "io_first");
  ASSERT_EQ(a.code, 0) << a.out << a.err;
  o = with_keys(o, {{"output_dir", (tmp / "second").string()},
                    {"max_steps_per_epoch", "1"},
                    {"optimizer.lr", "0"},
                    {"checkpointer.checkpoint_dir", (tmp / "first").string()},
                    {"checkpointer.adapter_checkpoint", "epoch_0"}});
  const CliRun b = run_recipe(1, "lora_finetune_single_device", config, o, tmp / "io_second");
  ASSERT_EQ(b.code, 0) << b.out << b.err;
  EXPECT_TRUE(read_text(tmp / "second" / "epoch_0" / "adapter_model.safetensors") ==
              read_text(tmp / "first" / "epoch_0" / "adapter_model.safetensors"));
  std::printf("adapter_checkpoint_bf16: %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}
