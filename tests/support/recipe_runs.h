#pragma once
// Running the built `fusetune` binary from tests: whole training runs with config overrides,
// their logged losses (metrics.jsonl holds them at full double precision, so runs compare
// bitwise), and a spawned run that a test can kill.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_paths.h"

namespace fusetune::testing {

namespace rr_fs = std::filesystem;

inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

inline std::string read_text(const rr_fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_text(const rr_fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
}

// Keys and values of `key=value` overrides; a key `~name` with an empty value deletes `name`.
using Overrides = std::map<std::string, std::string>;

// Idle OpenMP threads sleep instead of spinning: the test machine's cores are shared, and a
// spinning team slows every run down severalfold (results do not depend on it).
inline const std::string kPassiveWait = "OMP_WAIT_POLICY=passive ";

// The command line of `fusetune run RECIPE --config CONFIG key=value...`.
inline std::string run_command(const std::string& recipe, const std::string& config,
                               const Overrides& o) {
  std::string cmd =
      shell_quote(::fusetune::testing::binary_path()) + " run " + recipe + " --config " + shell_quote(config);
  // Deletions (`~key`, empty value) first, so that the keys set after them stay.
  for (const auto& [k, v] : o)
    if (!k.empty() && k[0] == '~') cmd += " " + shell_quote(k);
  for (const auto& [k, v] : o)
    if (k.empty() || k[0] != '~') cmd += " " + shell_quote(k + "=" + v);
  return cmd;
}

struct CliRun {
  int code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs `command` (a shell command line) in the source root, where the demo config's relative
// corpus path resolves; stdout and stderr are captured separately under `scratch`.
inline CliRun run_shell(const std::string& command, const rr_fs::path& scratch) {
  rr_fs::create_directories(scratch);
  const rr_fs::path out = scratch / "stdout.txt", err = scratch / "stderr.txt";
  const std::string cmd = "cd " + shell_quote(::fusetune::testing::source_dir()) + " && " + kPassiveWait +
                          command + " >" + shell_quote(out) + " 2>" + shell_quote(err);
  const int status = std::system(cmd.c_str());
  CliRun r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_text(out);
  r.err = read_text(err);
  return r;
}

// The demo (configs/demo/tiny_full.yaml) made small: 6 steps of 2 x 64 bytes, one thread,
// every step logged. `extra` overrides or adds keys.
inline Overrides demo_overrides(const rr_fs::path& output_dir, const Overrides& extra = {}) {
  Overrides o = {
      {"output_dir", output_dir.string()}, {"max_steps_per_epoch", "6"}, {"batch_size", "2"},
      {"tokenizer.max_seq_len", "64"},     {"num_threads", "1"},         {"log_every_n_steps", "1"},
      {"log_peak_memory_stats", "false"}};
  for (const auto& [k, v] : extra) o[k] = v;
  return o;
}

inline std::string demo_command(const rr_fs::path& output_dir, const Overrides& extra = {}) {
  return run_command("full_finetune_single_device", "demo/tiny_full",
                     demo_overrides(output_dir, extra));
}

// One logged optimizer step, from output_dir/logs/metrics.jsonl.
struct LoggedStep {
  int64_t step = 0;
  int64_t epoch = 0;
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;  // 0 when not logged
};

inline std::vector<LoggedStep> logged_steps(const rr_fs::path& output_dir) {
  std::vector<LoggedStep> steps;
  std::istringstream in(read_text(output_dir / "logs" / "metrics.jsonl"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line);
    if (!j.contains("loss")) continue;  // a val_loss line, not a training step
    LoggedStep s;
    s.step = j.at("step").get<int64_t>();
    s.epoch = j.at("epoch").get<int64_t>();
    s.loss = j.at("loss").get<double>();
    s.lr = j.at("lr").get<double>();
    if (j.contains("grad_norm") && !j["grad_norm"].is_null())
      s.grad_norm = j["grad_norm"].get<double>();
    steps.push_back(s);
  }
  return steps;
}

inline std::vector<double> losses_of(const std::vector<LoggedStep>& steps) {
  std::vector<double> v;
  for (const auto& s : steps) v.push_back(s.loss);
  return v;
}

// The (step, loss) pairs of the printed `Step N | loss:X ...` lines.
inline std::vector<std::pair<int64_t, double>> printed_steps(const std::string& stdout_text) {
  std::vector<std::pair<int64_t, double>> v;
  static const std::regex re(R"(Step (\d+) \| loss:([-0-9.naif]+))");
  for (auto it = std::sregex_iterator(stdout_text.begin(), stdout_text.end(), re);
       it != std::sregex_iterator(); ++it)
    v.push_back({std::stoll((*it)[1]), std::stod((*it)[2])});
  return v;
}

// Checkpoint directories that look complete: epoch_* / step_* without ".tmp" in the name.
inline std::vector<std::string> complete_looking_checkpoints(const rr_fs::path& output_dir) {
  std::vector<std::string> v;
  std::error_code ec;
  if (!rr_fs::is_directory(output_dir, ec)) return v;
  for (const auto& e : rr_fs::directory_iterator(output_dir)) {
    const std::string name = e.path().filename().string();
    if ((name.rfind("epoch_", 0) == 0 || name.rfind("step_", 0) == 0) &&
        name.find(".tmp") == std::string::npos)
      v.push_back(name);
  }
  return v;
}

// A run in the background (stdout and stderr to files under `scratch`), to be killed.
class SpawnedRun {
 public:
  SpawnedRun(const std::string& command, const rr_fs::path& scratch) {
    rr_fs::create_directories(scratch);
    const std::string cmd = "cd " + shell_quote(::fusetune::testing::source_dir()) + " && " + kPassiveWait +
                            "exec " + command + " >" + shell_quote(scratch / "stdout.txt") + " 2>" +
                            shell_quote(scratch / "stderr.txt");
    pid_ = ::fork();
    if (pid_ == 0) {
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~SpawnedRun() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      wait();
    }
  }
  SpawnedRun(const SpawnedRun&) = delete;
  SpawnedRun& operator=(const SpawnedRun&) = delete;

  bool started() const { return pid_ > 0; }
  // Polls until `path` exists (true) or the process exits or `timeout` passes (false).
  bool wait_for_file(const rr_fs::path& path, std::chrono::seconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      std::error_code ec;
      if (rr_fs::exists(path, ec)) return true;
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        reaped_ = true;
        status_ = status;
        return rr_fs::exists(path, ec);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }
  // SIGKILL; true when the signal is what ended the process (it had not finished by itself).
  bool kill9() {
    if (!reaped_) ::kill(pid_, SIGKILL);
    wait();
    return WIFSIGNALED(status_) && WTERMSIG(status_) == SIGKILL;
  }

 private:
  void wait() {
    if (reaped_) return;
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    status_ = status;
    reaped_ = true;
  }
  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = 0;
};

}  // namespace fusetune::testing
