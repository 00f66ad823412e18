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
#include "recipe_matrix.h"
#include "resume_runs.h"

using namespace fusetune::testing;
namespace fs = std::filesystem;

namespace {

class ResumeMatrix : public ::testing::TestWithParam<RecipeCase> {};

TEST_P(ResumeMatrix, ResumedRunIsBitwiseTheUninterruptedOne) {
  const RecipeCase& c = GetParam();
  if (c.ranks > 1) FT_REQUIRE_MPIRUN();
  const auto t0 = std::chrono::steady_clock::now();
  const TempDir tmp;
  // 2 epochs x 2 steps, checkpoints step_1, epoch_0 (step 2), step_3, epoch_1 (step 4).
  Overrides o = {{"epochs", "2"}, {"max_steps_per_epoch", "2"}, {"save_every_n_steps", "1"}};
  const fs::path config = write_case_config(c, tmp.path(), o);
  ASSERT_FALSE(config.empty());

  const fs::path whole = tmp / "whole";
  o["output_dir"] = whole.string();
  const CliRun w = run_recipe(c.ranks, c.recipe, config, o, tmp / "io_whole");
  ASSERT_EQ(w.code, 0) << w.out << w.err;
  const auto want = compared_step_values(whole);
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
  const auto got = compared_step_values(resumed);
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

INSTANTIATE_TEST_SUITE_P(Recipes, ResumeMatrix, ::testing::ValuesIn(recipe_matrix()),
                         [](const ::testing::TestParamInfo<RecipeCase>& i) {
                           return i.param.name;
                         });

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
      kTinyLoraKeys,
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
