#include "mpi_runs.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

namespace fusetune::testing {

bool have_mpirun() { return std::system("command -v mpirun >/dev/null 2>&1") == 0; }

void set_mpi_test_environment() {
  ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  ::setenv("OMP_NUM_THREADS", "1", 1);
  ::setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
  // Open MPI's session directory defaults to /tmp/ompi.HOST.UID, shared by every mpirun on the
  // machine: one run's cleanup can remove it while a concurrent test's mpirun (ctest -j) is
  // creating its own session inside it ("mkdir ... /tmp/ompi.HOST.0/pid.N: No such file or
  // directory", orte_init failed). Each test process gets its own base, removed at exit.
  static const std::filesystem::path base =
      std::filesystem::temp_directory_path() / ("fusetune-ompi-" + std::to_string(::getpid()));
  static const bool made = [] {
    std::filesystem::create_directories(base);
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(base, ignored);
    });
    return true;
  }();
  (void)made;
  ::setenv("OMPI_MCA_orte_tmpdir_base", base.c_str(), 1);
}

void run_ok(const std::string& cmd, const std::filesystem::path& scratch) {
  const CliRun r = run_shell(cmd, scratch);
  ASSERT_EQ(r.code, 0) << cmd << "\n" << r.out << r.err;
}

void expect_same_curve(const std::vector<double>& a, const std::vector<double>& b,
                       const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_LE(std::abs(a[i] - b[i]), 1e-5 * std::abs(b[i]))
        << what << ": step " << i + 1 << ": " << a[i] << " vs " << b[i];
}

std::string mpirun_command(int ranks, const std::string& recipe, const std::string& config,
                           const Overrides& o, const std::string& mpirun_options) {
  return "mpirun -np " + std::to_string(ranks) + " --bind-to none " + mpirun_options + " " +
         run_command(recipe, config, o);
}

std::filesystem::path write_uneven_corpus(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  const std::filesystem::path p = dir / "corpus.jsonl";
  std::ostringstream s;
  const std::string words = "the quick brown fox jumps over the lazy dog while a cat sleeps ";
  for (int i = 0; i < 48; ++i) {
    const size_t len = 8 + size_t(i * 37 % 53);
    std::string text;
    for (size_t k = 0; k < len; ++k) text += words[(k + size_t(i) * 7) % words.size()];
    s << "{\"text\": \"" << text << "\"}\n";
  }
  write_text(p, s.str());
  return p;
}

Overrides rank_run_overrides(const std::filesystem::path& out, const std::filesystem::path& corpus,
                             int batch, int steps, const Overrides& extra) {
  Overrides o = {{"output_dir", out.string()},
                 {"max_steps_per_epoch", std::to_string(steps)},
                 {"batch_size", std::to_string(batch)},
                 {"tokenizer.max_seq_len", "64"},
                 {"dataset.source", corpus.string()},
                 {"dataset.packed", "false"},
                 {"num_threads", "1"},
                 {"log_every_n_steps", "1"},
                 {"log_peak_memory_stats", "false"}};
  for (const auto& [k, v] : extra) o[k] = v;
  return o;
}

BackgroundCommand::BackgroundCommand(const std::string& command, const rr_fs::path& scratch)
    : pid_(spawn_in_background(command, scratch)) {}

BackgroundCommand::~BackgroundCommand() {
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
}

int BackgroundCommand::wait_exit(std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!reaped_) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      reaped_ = true;
      status_ = status;
      break;
    }
    if (std::chrono::steady_clock::now() >= end) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return status_;
}

pid_t mpi_rank_pid(pid_t launcher, int rank) {
  const std::string want = "OMPI_COMM_WORLD_RANK=" + std::to_string(rank);
  for (const auto& e : rr_fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_text(e.path() / "stat");
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(stat.substr(close + 2));
    std::string state;
    pid_t ppid = 0;
    fields >> state >> ppid;
    if (ppid != launcher) continue;
    const std::string env = read_text(e.path() / "environ");
    size_t at = 0;
    while (at < env.size()) {
      const size_t end = env.find('\0', at);
      if (env.compare(at, (end == std::string::npos ? env.size() : end) - at, want) == 0)
        return pid_t(std::stol(name));
      if (end == std::string::npos) break;
      at = end + 1;
    }
  }
  return -1;
}

}  // namespace fusetune::testing
