#pragma once
// Starting the built `fusetune` as MPI ranks from tests: whether mpirun exists, the
// environment it needs here (root in containers, one thread per rank) and the command lines.
#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "recipe_runs.h"
#include "test_support.h"

namespace fusetune::testing {

bool have_mpirun();

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
// allocations when the binary is sanitized; Open MPI's session files under a directory of this
// test process's own (concurrent tests' mpiruns raced in the shared default).
void set_mpi_test_environment();

// Runs a command line that must succeed (its output in the failure message).
void run_ok(const std::string& cmd, const std::filesystem::path& scratch);

// Two loss curves, step by step: |a - b| <= 1e-5 |b| (the equivalence tests' tolerance).
void expect_same_curve(const std::vector<double>& a, const std::vector<double>& b,
                       const std::string& what);

// `mpirun -np N [mca] fusetune run RECIPE --config CONFIG overrides...`.
std::string mpirun_command(int ranks, const std::string& recipe, const std::string& config,
                           const Overrides& o, const std::string& mpirun_options = "");

// Rows of different lengths (unpacked, padded per batch): each rank's count of unmasked
// tokens differs, so a loss normalized per rank would not match the one-process reference.
std::filesystem::path write_uneven_corpus(const std::filesystem::path& dir);

// The keys of a run compared across rank counts: the uneven corpus unpacked, `batch` rows per
// rank, `steps` optimizer steps, one thread, every step logged; `extra` adds or overrides.
Overrides rank_run_overrides(const std::filesystem::path& out, const std::filesystem::path& corpus,
                             int batch, int steps, const Overrides& extra = {});

// A command in the background whose process id a test needs (to find mpirun's ranks).
class BackgroundCommand {
 public:
  BackgroundCommand(const std::string& command, const rr_fs::path& scratch);
  ~BackgroundCommand();
  BackgroundCommand(const BackgroundCommand&) = delete;
  BackgroundCommand& operator=(const BackgroundCommand&) = delete;

  pid_t pid() const { return pid_; }
  // Waits up to `timeout` for the process to end; its wait status, or -1 when still running.
  int wait_exit(std::chrono::milliseconds timeout);

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = 0;
};

// The process id of MPI rank `rank` among the children of `launcher` (mpirun starts the local
// ranks itself), or -1.
pid_t mpi_rank_pid(pid_t launcher, int rank);

}  // namespace fusetune::testing
