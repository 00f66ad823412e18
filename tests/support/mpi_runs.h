#pragma once
// Starting the built `fusetune` as MPI ranks from tests: whether mpirun exists, the
// environment it needs here (root in containers, one thread per rank) and the command lines.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "recipe_runs.h"
#include "test_support.h"

namespace fusetune::testing {

inline bool have_mpirun() { return std::system("command -v mpirun >/dev/null 2>&1") == 0; }

// Skips (or, under FUSETUNE_REQUIRE_ASSETS=1, fails) when Open MPI's mpirun is absent.
#define FT_REQUIRE_MPIRUN()                                   \
  do {                                                        \
    if (!::fusetune::testing::have_mpirun())                  \
      FT_SKIP_UNLESS_REQUIRED(                                \
          "mpirun not found: install Open MPI (openmpi-bin; " \
          "scripts/install_deps.sh installs it)");            \
    ::fusetune::testing::set_mpi_test_environment();          \
  } while (0)

// Inherited by mpirun and the ranks: Open MPI refuses root without these; one OpenMP thread
// per rank (2 ranks x 1 thread on a 2-core machine); no leak report from Open MPI's
// allocations when the binary is sanitized.
inline void set_mpi_test_environment() {
  ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  ::setenv("OMP_NUM_THREADS", "1", 1);
  ::setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
}

// The largest peak_memory_alloc_bytes logged in output_dir/logs/metrics.jsonl (rank 0's; 0 when
// none).
inline int64_t logged_peak_bytes(const std::filesystem::path& output_dir) {
  int64_t peak = 0;
  std::istringstream in(read_text(output_dir / "logs" / "metrics.jsonl"));
  std::string line;
  while (std::getline(in, line))
    if (!line.empty())
      peak =
          std::max(peak, nlohmann::json::parse(line).value("peak_memory_alloc_bytes", int64_t{0}));
  return peak;
}

// The values of `key` in output_dir/logs/metrics.jsonl, in line order (the lines that have it).
inline std::vector<double> logged_values(const std::filesystem::path& output_dir,
                                         const std::string& key) {
  std::vector<double> v;
  std::istringstream in(read_text(output_dir / "logs" / "metrics.jsonl"));
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.contains(key)) v.push_back(j.at(key).get<double>());
    }
  return v;
}

// Runs a command line that must succeed (its output in the failure message).
inline void run_ok(const std::string& cmd, const std::filesystem::path& scratch) {
  const CliRun r = run_shell(cmd, scratch);
  ASSERT_EQ(r.code, 0) << cmd << "\n" << r.out << r.err;
}

// Two loss curves, step by step: |a - b| <= 1e-5 |b| (the equivalence tests' tolerance).
inline void expect_same_curve(const std::vector<double>& a, const std::vector<double>& b,
                              const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_LE(std::abs(a[i] - b[i]), 1e-5 * std::abs(b[i]))
        << what << ": step " << i + 1 << ": " << a[i] << " vs " << b[i];
}

// `mpirun -np N [mca] fusetune run RECIPE --config CONFIG overrides...`.
inline std::string mpirun_command(int ranks, const std::string& recipe, const std::string& config,
                                  const Overrides& o, const std::string& mpirun_options = "") {
  return "mpirun -np " + std::to_string(ranks) + " --bind-to none " + mpirun_options + " " +
         run_command(recipe, config, o);
}

// Rows of different lengths (unpacked, padded per batch): each rank's count of unmasked
// tokens differs, so a loss normalized per rank would not match the one-process reference.
inline std::filesystem::path write_uneven_corpus(const std::filesystem::path& dir) {
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

// The keys of a run compared across rank counts: the uneven corpus unpacked, `batch` rows per
// rank, `steps` optimizer steps, one thread, every step logged; `extra` adds or overrides.
inline Overrides rank_run_overrides(const std::filesystem::path& out,
                                    const std::filesystem::path& corpus, int batch, int steps,
                                    const Overrides& extra = {}) {
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

}  // namespace fusetune::testing

namespace fusetune::testing {

// A command in the background whose process id a test needs (to find mpirun's ranks).
class BackgroundCommand {
 public:
  BackgroundCommand(const std::string& command, const rr_fs::path& scratch) {
    rr_fs::create_directories(scratch);
    const std::string cmd = "cd " + shell_quote(source_dir()) + " && exec " + command + " >" +
                            shell_quote(scratch / "stdout.txt") + " 2>" +
                            shell_quote(scratch / "stderr.txt");
    pid_ = ::fork();
    if (pid_ == 0) {
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~BackgroundCommand() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
  }
  BackgroundCommand(const BackgroundCommand&) = delete;
  BackgroundCommand& operator=(const BackgroundCommand&) = delete;

  pid_t pid() const { return pid_; }
  // Waits up to `timeout` for the process to end; its wait status, or -1 when still running.
  int wait_exit(std::chrono::milliseconds timeout) {
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

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = 0;
};

// The process id of MPI rank `rank` among the children of `launcher` (mpirun starts the local
// ranks itself), or -1.
inline pid_t mpi_rank_pid(pid_t launcher, int rank) {
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
