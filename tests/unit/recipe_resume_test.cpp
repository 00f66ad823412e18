// Resuming the full fine-tune: from a mid-epoch step checkpoint, from an epoch boundary, and
// after a SIGKILL, the resumed run logs exactly (bitwise) the losses of an uninterrupted run
// and ends with the same weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "recipe_runs.h"
#include "test_support.h"

namespace fs = std::filesystem;
using fusetune::testing::CliRun;
using fusetune::testing::demo_command;
using fusetune::testing::logged_steps;
using fusetune::testing::LoggedStep;
using fusetune::testing::Overrides;
using fusetune::testing::printed_steps;
using fusetune::testing::read_text;
using fusetune::testing::run_shell;
using fusetune::testing::SpawnedRun;
using fusetune::testing::TempDir;

namespace {

// 2 epochs of 8 steps, a step checkpoint every 3: step_3, step_6, epoch_0 (step 8), step_9,
// step_12, step_15, epoch_1 (step 16).
const Overrides kRun = {{"epochs", "2"}, {"max_steps_per_epoch", "8"}, {"save_every_n_steps", "3"}};
constexpr int64_t kTotal = 16;

Overrides with_resume() {
  Overrides o = kRun;
  o["resume_from_checkpoint"] = "true";
  return o;
}

// The uninterrupted reference run, made once for the test suite (every test here compares to
// it) and removed after it; made again if the suite runs again (--gtest_repeat).
struct Reference {
  fs::path dir;
  std::vector<LoggedStep> steps;
  bool ok = false;
};

Reference make_reference() {
  Reference r;
  r.dir = fs::temp_directory_path() / "fusetune_tests" /
          ("recipe_resume_reference_" + std::to_string(::getpid()));
  fs::remove_all(r.dir);
  CliRun run = run_shell(demo_command(r.dir / "out", kRun), r.dir / "io");
  EXPECT_EQ(run.code, 0) << run.err;
  r.steps = logged_steps(r.dir / "out");
  r.ok = run.code == 0 && int64_t(r.steps.size()) == kTotal;
  return r;
}

Reference& reference_slot() {
  static Reference ref;
  return ref;
}

const Reference& reference() {
  Reference& ref = reference_slot();
  if (ref.dir.empty()) ref = make_reference();
  return ref;
}

class RecipeResume : public ::testing::Test {
 protected:
  static void TearDownTestSuite() {
    std::error_code ec;
    if (!reference_slot().dir.empty()) fs::remove_all(reference_slot().dir, ec);
    reference_slot() = Reference{};
  }
};

// Checks that `out` (a resumed run's output_dir, whose run printed `printed_stdout`) ran the
// steps after `from_step` with the reference's exact losses and ended with its exact weights.
void expect_matches_reference(const fs::path& out, const std::string& printed_stdout,
                              int64_t from_step) {
  const Reference& ref = reference();
  auto printed = printed_steps(printed_stdout);
  ASSERT_FALSE(printed.empty()) << printed_stdout;
  EXPECT_EQ(printed.front().first, from_step + 1)
      << "the resumed run should continue after step " << from_step;
  EXPECT_EQ(printed.back().first, kTotal);
  EXPECT_EQ(int64_t(printed.size()), kTotal - from_step);
  // metrics.jsonl is appended to: the last entries are the resumed run's.
  auto steps = logged_steps(out);
  ASSERT_GE(int64_t(steps.size()), kTotal - from_step);
  for (size_t i = steps.size() - size_t(kTotal - from_step); i < steps.size(); ++i) {
    const LoggedStep& s = steps[i];
    ASSERT_GE(s.step, 1);
    ASSERT_LE(s.step, kTotal);
    const LoggedStep& want = ref.steps[size_t(s.step - 1)];
    EXPECT_EQ(s.loss, want.loss) << "step " << s.step;
    EXPECT_EQ(s.lr, want.lr) << "step " << s.step;
    EXPECT_EQ(s.grad_norm, want.grad_norm) << "step " << s.step;
    EXPECT_EQ(s.epoch, want.epoch) << "step " << s.step;
  }
  EXPECT_TRUE(read_text(out / "epoch_1" / "model.safetensors") ==
              read_text(ref.dir / "out" / "epoch_1" / "model.safetensors"))
      << "the final weights differ from the uninterrupted run's";
  EXPECT_TRUE(read_text(out / "epoch_1" / "recipe_state.safetensors") ==
              read_text(ref.dir / "out" / "epoch_1" / "recipe_state.safetensors"))
      << "the final optimizer state differs from the uninterrupted run's";
}

// A copy of the reference output holding only checkpoint `keep`: what a run stopped right
// after saving it leaves behind.
fs::path stopped_after(const TempDir& tmp, const std::string& keep) {
  const fs::path out = tmp / "out";
  fs::create_directories(out);
  fs::copy(reference().dir / "out" / keep, out / keep, fs::copy_options::recursive);
  return out;
}

}  // namespace

TEST_F(RecipeResume, ReferenceRunSavesEveryThreeSteps) {
  const Reference& ref = reference();
  ASSERT_TRUE(ref.ok);
  for (const char* d : {"step_3", "step_6", "epoch_0", "step_9", "step_12", "step_15", "epoch_1"}) {
    EXPECT_TRUE(fs::exists(ref.dir / "out" / d / "recipe_state.json")) << d;
    EXPECT_TRUE(fs::exists(ref.dir / "out" / d / "model.safetensors")) << d;
  }
  // No step checkpoint where an epoch one is written (step 8 is epoch_0's last step).
  EXPECT_FALSE(fs::exists(ref.dir / "out" / "step_8"));
  EXPECT_FALSE(fs::exists(ref.dir / "out" / "step_16"));
  for (int64_t i = 0; i < kTotal; ++i) {
    EXPECT_EQ(ref.steps[size_t(i)].step, i + 1);
    EXPECT_EQ(ref.steps[size_t(i)].epoch, i < 8 ? 1 : 2);
  }
}

TEST_F(RecipeResume, MidEpochStepCheckpoint) {
  ASSERT_TRUE(reference().ok);
  TempDir tmp;
  const fs::path out = stopped_after(tmp, "step_3");
  CliRun r = run_shell(demo_command(out, with_resume()), tmp / "io");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("step_3"), std::string::npos)
      << "the header should name the checkpoint resumed from";
  expect_matches_reference(out, r.out, 3);
}

TEST_F(RecipeResume, EpochBoundary) {
  ASSERT_TRUE(reference().ok);
  TempDir tmp;
  const fs::path out = stopped_after(tmp, "epoch_0");
  CliRun r = run_shell(demo_command(out, with_resume()), tmp / "io");
  ASSERT_EQ(r.code, 0) << r.err;
  expect_matches_reference(out, r.out, 8);
}

TEST_F(RecipeResume, FirstStepOfSecondEpoch) {
  ASSERT_TRUE(reference().ok);
  TempDir tmp;
  const fs::path out = stopped_after(tmp, "step_9");
  CliRun r = run_shell(demo_command(out, with_resume()), tmp / "io");
  ASSERT_EQ(r.code, 0) << r.err;
  expect_matches_reference(out, r.out, 9);
}

// The latest resumable checkpoint wins; a directory without recipe_state.json (a save cut
// short after the model files) is not resumable, nor is a leftover temp directory.
TEST_F(RecipeResume, PicksLatestCompleteCheckpoint) {
  ASSERT_TRUE(reference().ok);
  TempDir tmp;
  const fs::path out = stopped_after(tmp, "step_3");
  fs::copy(reference().dir / "out" / "step_6", out / "step_6", fs::copy_options::recursive);
  fs::copy(reference().dir / "out" / "step_9", out / "step_9", fs::copy_options::recursive);
  fs::copy(reference().dir / "out" / "step_12", out / "step_12.tmp-999-0",
           fs::copy_options::recursive);
  fs::remove(out / "step_9" / "recipe_state.json");
  CliRun r = run_shell(demo_command(out, with_resume()), tmp / "io");
  ASSERT_EQ(r.code, 0) << r.err;
  expect_matches_reference(out, r.out, 6);
}

// A run killed with SIGKILL mid-training, after its step_3 checkpoint was written, resumes
// where its last complete checkpoint left it.
TEST_F(RecipeResume, AfterSigkill) {
  ASSERT_TRUE(reference().ok);
  TempDir tmp;
  const fs::path out = tmp / "out";
  {
    SpawnedRun run(demo_command(out, kRun), tmp / "killed_io");
    ASSERT_TRUE(run.started());
    ASSERT_TRUE(run.wait_for_file(out / "step_3" / "recipe_state.json", std::chrono::seconds(120)))
        << read_text(tmp / "killed_io" / "stderr.txt");
    ASSERT_TRUE(run.kill9()) << "the run finished before it could be killed";
  }
  ASSERT_FALSE(fs::exists(out / "epoch_1" / "recipe_state.json"));
  CliRun r = run_shell(demo_command(out, with_resume()), tmp / "io");
  ASSERT_EQ(r.code, 0) << r.err;
  auto printed = printed_steps(r.out);
  ASSERT_FALSE(printed.empty()) << r.out;
  const int64_t from = printed.front().first - 1;
  EXPECT_GE(from, 3);
  EXPECT_LT(from, kTotal);
  EXPECT_NE(r.out.find("resumed_from"), std::string::npos) << r.out;
  expect_matches_reference(out, r.out, from);
}

// Resuming a finished run trains nothing more and succeeds.
TEST_F(RecipeResume, FinishedRunHasNothingLeft) {
  ASSERT_TRUE(reference().ok);
  TempDir tmp;
  const fs::path out = stopped_after(tmp, "epoch_1");
  CliRun r = run_shell(demo_command(out, with_resume()), tmp / "io");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(printed_steps(r.out).empty()) << r.out;
  EXPECT_TRUE(read_text(out / "epoch_1" / "model.safetensors") ==
              read_text(reference().dir / "out" / "epoch_1" / "model.safetensors"));
}

// Resuming under another seed would shuffle differently: refused, with the reason.
TEST_F(RecipeResume, RefusesAnotherSeed) {
  ASSERT_TRUE(reference().ok);
  TempDir tmp;
  const fs::path out = stopped_after(tmp, "step_3");
  Overrides o = with_resume();
  o["seed"] = "43";
  CliRun r = run_shell(demo_command(out, o), tmp / "io");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("seed 42"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("seed 43"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}
