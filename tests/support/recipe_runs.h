#pragma once
// Running the built `fusetune` binary from tests: whole training runs with config overrides,
// their logged losses (metrics_log.h: metrics.jsonl holds them at full double precision, so
// runs compare bitwise), and a spawned run that a test can kill.
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "files.h"
#include "metrics_log.h"
#include "test_paths.h"

namespace fusetune::testing {

namespace rr_fs = std::filesystem;

// `s` as one single-quoted shell word.
std::string shell_quote(const std::string& s);

// Keys and values of `key=value` overrides; a key `~name` with an empty value deletes `name`.
using Overrides = std::map<std::string, std::string>;

// Idle OpenMP threads sleep instead of spinning: the test machine's cores are shared, and a
// spinning team slows every run down severalfold (results do not depend on it).
inline const std::string kPassiveWait = "OMP_WAIT_POLICY=passive ";

// The command line of `fusetune run RECIPE --config CONFIG key=value...`.
std::string run_command(const std::string& recipe, const std::string& config, const Overrides& o);

struct CliRun {
  int code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs `command` (a shell command line) in the source root, where the demo config's relative
// corpus path resolves; stdout and stderr are captured separately under `scratch`.
CliRun run_shell(const std::string& command, const rr_fs::path& scratch);

// The demo (configs/demo/tiny_full.yaml) made small: 6 steps of 2 x 64 bytes, one thread,
// every step logged. `extra` overrides or adds keys.
Overrides demo_overrides(const rr_fs::path& output_dir, const Overrides& extra = {});

std::string demo_command(const rr_fs::path& output_dir, const Overrides& extra = {});

// The (step, loss) pairs of the printed `Step N | loss:X ...` lines.
std::vector<std::pair<int64_t, double>> printed_steps(const std::string& stdout_text);

// Checkpoint directories that look complete: epoch_* / step_* without ".tmp" in the name.
std::vector<std::string> complete_looking_checkpoints(const rr_fs::path& output_dir);

// Starts `prefix` + "exec " + `command` through /bin/sh in the source root, its stdout and
// stderr to scratch/stdout.txt and scratch/stderr.txt; the child's process id (-1 when fork
// failed).
pid_t spawn_in_background(const std::string& command, const rr_fs::path& scratch,
                          const std::string& prefix = "");

// A run in the background (stdout and stderr to files under `scratch`), to be killed.
class SpawnedRun {
 public:
  SpawnedRun(const std::string& command, const rr_fs::path& scratch);
  ~SpawnedRun();
  SpawnedRun(const SpawnedRun&) = delete;
  SpawnedRun& operator=(const SpawnedRun&) = delete;

  bool started() const { return pid_ > 0; }
  // Polls until `path` exists (true) or the process exits or `timeout` passes (false).
  bool wait_for_file(const rr_fs::path& path, std::chrono::seconds timeout);
  // SIGKILL; true when the signal is what ended the process (it had not finished by itself).
  bool kill9();

 private:
  void wait();
  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = 0;
};

}  // namespace fusetune::testing
