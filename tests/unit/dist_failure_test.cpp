// A rank that dies (SIGKILL) or hangs (SIGSTOP) mid-training: every other rank ends within a
// bounded time with a message naming what it waited for, no rank is left running, and the last
// complete checkpoint loads.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "fusetune/recipes/training_checkpoint.h"
#include "mpi_runs.h"
#include "recipe_runs.h"
#include "test_support.h"

using namespace fusetune::testing;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

// A long run (hundreds of epochs of the demo) that checkpoints every 2 steps: it is still
// training when the test interferes (a few seconds later, a few MB of checkpoints).
std::string long_run(const fs::path& out, const std::string& timeout_s) {
  Overrides o = demo_overrides(out, {{"epochs", "500"},
                                     {"save_every_n_steps", "2"},
                                     {"log_every_n_steps", "50"},
                                     {"dist_timeout_seconds", timeout_s}});
  o.erase("max_steps_per_epoch");
  return mpirun_command(2, "full_finetune_distributed", "demo/tiny_full", o);
}

bool process_gone(pid_t pid) {
  // Not running: no such process, or a zombie nobody reaped yet.
  if (::kill(pid, 0) != 0) return true;
  const std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'Z';
}

void expect_last_checkpoint_loads(const fs::path& out) {
  const auto last = fusetune::latest_resumable_checkpoint(out);
  ASSERT_TRUE(last.has_value()) << "no complete checkpoint in " << out;
  const fusetune::ResumedState s = fusetune::load_training_checkpoint(*last, fusetune::DType::F32);
  EXPECT_GE(s.progress.global_step, 2);
  EXPECT_FALSE(s.params.empty());
}

}  // namespace

TEST(DistFailure, KilledRankEndsTheRunAndTheLastCheckpointLoads) {
  FT_REQUIRE_MPIRUN();
  const TempDir tmp;
  const fs::path out = tmp.path() / "out";
  BackgroundCommand run(long_run(out, "30"), tmp.path() / "s");
  // Wait for a checkpoint, then kill rank 1.
  const auto t0 = std::chrono::steady_clock::now();
  while (!fs::exists(out / "step_2") && std::chrono::steady_clock::now() - t0 < 60s &&
         run.wait_exit(0ms) == -1)
    std::this_thread::sleep_for(5ms);
  ASSERT_TRUE(fs::exists(out / "step_2")) << read_text(tmp.path() / "s" / "stderr.txt");
  const pid_t rank0 = mpi_rank_pid(run.pid(), 0), rank1 = mpi_rank_pid(run.pid(), 1);
  ASSERT_GT(rank0, 0);
  ASSERT_GT(rank1, 0);
  ASSERT_EQ(::kill(rank1, SIGKILL), 0);
  const auto killed = std::chrono::steady_clock::now();
  const int status = run.wait_exit(60s);
  ASSERT_NE(status, -1) << "the run did not end within 60 s of losing a rank";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << status;
  EXPECT_LT(std::chrono::steady_clock::now() - killed, 35s);
  const std::string err = read_text(tmp.path() / "s" / "stderr.txt");
  EXPECT_NE(err.find("rank 1"), std::string::npos) << err;
  EXPECT_NE(err.find("signal 9"), std::string::npos) << err;
  EXPECT_TRUE(process_gone(rank0)) << "rank 0 is still running";
  expect_last_checkpoint_loads(out);
}

TEST(DistFailure, HungRankTimesOutWithTheStepNamed) {
  FT_REQUIRE_MPIRUN();
  const TempDir tmp;
  const fs::path out = tmp.path() / "out";
  BackgroundCommand run(long_run(out, "2"), tmp.path() / "s");
  const auto t0 = std::chrono::steady_clock::now();
  while (!fs::exists(out / "step_2") && std::chrono::steady_clock::now() - t0 < 60s &&
         run.wait_exit(0ms) == -1)
    std::this_thread::sleep_for(5ms);
  ASSERT_TRUE(fs::exists(out / "step_2")) << read_text(tmp.path() / "s" / "stderr.txt");
  const pid_t rank0 = mpi_rank_pid(run.pid(), 0), rank1 = mpi_rank_pid(run.pid(), 1);
  ASSERT_GT(rank0, 0);
  ASSERT_GT(rank1, 0);
  ASSERT_EQ(::kill(rank1, SIGSTOP), 0);  // alive, but never answers again
  const auto stopped = std::chrono::steady_clock::now();
  const int status = run.wait_exit(60s);
  if (status == -1) ::kill(rank1, SIGKILL);
  ASSERT_NE(status, -1) << "the run did not end within 60 s of a rank hanging";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << status;
  EXPECT_LT(std::chrono::steady_clock::now() - stopped, 30s);
  const std::string err = read_text(tmp.path() / "s" / "stderr.txt");
  EXPECT_NE(err.find("rank 0 of 2: "), std::string::npos) << err;
  EXPECT_NE(err.find(" of step "), std::string::npos) << err;
  EXPECT_NE(err.find("did not complete within dist_timeout_seconds (2 s)"), std::string::npos)
      << err;
  std::this_thread::sleep_for(200ms);
  EXPECT_TRUE(process_gone(rank0)) << "rank 0 is still running";
  EXPECT_TRUE(process_gone(rank1)) << "the hung rank was left behind";
  if (!process_gone(rank1)) ::kill(rank1, SIGKILL);
  expect_last_checkpoint_loads(out);
}
