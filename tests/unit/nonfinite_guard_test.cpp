// The non-finite guard of the training loop with a FINITE loss and a NON-FINITE gradient: the
// test-only fault FUSETUNE_TEST_ONLY_INF_GRADIENT_AT_STEP=3 (recipes/test_only_faults.h) makes
// one element of step 3's first handed-over gradient +inf on the last rank. The run must stop
// at step 3 naming the gradient (not the loss), log nothing for it, write no checkpoint of it,
// and hold bitwise the weights and optimizer state of step_2 when it stops (the loop saves them
// to test_only_stopped under the fault). Compiled, bf16, optimizer_in_bwd (the gradient is
// caught before any parameter of the step is updated) and 2 ranks at ZeRO-2 (the +inf sits in
// rank 1's gradients; rank 0 must learn of it through the global norm).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <ostream>
#include <string>

#include "resume_runs.h"

using namespace fusetune::testing;
namespace fs = std::filesystem;

namespace {

struct GuardCase {
  const char* name;
  const char* recipe;
  int ranks;
  Overrides extra;
  const char* message;  // what the error names
};

void PrintTo(const GuardCase& c, std::ostream* os) { *os << c.name; }

class NonFiniteGradient : public ::testing::TestWithParam<GuardCase> {};

TEST_P(NonFiniteGradient, StopsWithTheWeightsOfTheLastStep) {
  const GuardCase& c = GetParam();
  if (c.ranks > 1) FT_REQUIRE_MPIRUN();
  const auto t0 = std::chrono::steady_clock::now();
  const TempDir tmp;
  const fs::path config = tmp / "config.yaml";
  write_text(config, tiny_run_yaml(TinyData::Text,
                                   fs::path(source_dir()) / "configs/demo/demo_corpus.txt"));
  // 4 steps, checkpoints step_1 .. step_3 (epoch_0 after step 4).
  Overrides o = {{"output_dir", (tmp / "out").string()},
                 {"max_steps_per_epoch", "4"},
                 {"save_every_n_steps", "1"}};
  for (const auto& [k, v] : c.extra) o[k] = v;
  const CliRun r = run_recipe(c.ranks, c.recipe, config, o, tmp / "io",
                              "FUSETUNE_TEST_ONLY_INF_GRADIENT_AT_STEP=3");
  EXPECT_NE(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("step 3: the gradient"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("the loss is"), std::string::npos) << "the loss is finite\n" << r.err;
  const std::vector<LoggedStep> steps = logged_steps(tmp / "out");
  ASSERT_EQ(steps.size(), 2u) << r.out;
  EXPECT_EQ(steps.back().step, 2);
  EXPECT_FALSE(fs::exists(tmp / "out" / "step_3"));
  EXPECT_FALSE(fs::exists(tmp / "out" / "epoch_0"));
  ASSERT_TRUE(fs::exists(tmp / "out" / "test_only_stopped" / "recipe_state.json")) << r.err;
  // Weights and optimizer state as step 2 left them.
  expect_same_tensor_files(tmp / "out" / "test_only_stopped", tmp / "out" / "step_2", c.name);
  std::printf("%s: %.1f s\n", c.name,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

INSTANTIATE_TEST_SUITE_P(Runs, NonFiniteGradient,
                         ::testing::Values(GuardCase{"compiled",
                                                     "full_finetune_single_device",
                                                     1,
                                                     {{"compile", "true"}},
                                                     "the gradient norm is inf"},
                                           GuardCase{"bf16",
                                                     "full_finetune_single_device",
                                                     1,
                                                     {{"dtype", "bf16"}},
                                                     "the gradient norm is inf"},
                                           GuardCase{"optimizer_in_bwd",
                                                     "full_finetune_single_device",
                                                     1,
                                                     {{"optimizer_in_bwd", "true"},
                                                      {"~clip_grad_norm", ""}},
                                                     "is not finite (norm inf)"},
                                           GuardCase{"zero2_two_ranks",
                                                     "full_finetune_distributed",
                                                     2,
                                                     {{"zero_stage", "2"}},
                                                     "the gradient norm is inf"}),
                         [](const ::testing::TestParamInfo<GuardCase>& i) { return i.param.name; });

}  // namespace
