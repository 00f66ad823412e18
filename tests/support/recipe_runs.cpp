#include "recipe_runs.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <regex>
#include <system_error>
#include <thread>

namespace fusetune::testing {

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string run_command(const std::string& recipe, const std::string& config, const Overrides& o) {
  std::string cmd =
      shell_quote(binary_path()) + " run " + recipe + " --config " + shell_quote(config);
  // Deletions (`~key`, empty value) first, so that the keys set after them stay.
  for (const auto& [k, v] : o)
    if (!k.empty() && k[0] == '~') cmd += " " + shell_quote(k);
  for (const auto& [k, v] : o)
    if (k.empty() || k[0] != '~') cmd += " " + shell_quote(k + "=" + v);
  return cmd;
}

CliRun run_shell(const std::string& command, const rr_fs::path& scratch) {
  rr_fs::create_directories(scratch);
  const rr_fs::path out = scratch / "stdout.txt", err = scratch / "stderr.txt";
  const std::string cmd = "cd " + shell_quote(source_dir()) + " && " + kPassiveWait + command +
                          " >" + shell_quote(out) + " 2>" + shell_quote(err);
  const int status = std::system(cmd.c_str());
  CliRun r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_text(out);
  r.err = read_text(err);
  return r;
}

Overrides demo_overrides(const rr_fs::path& output_dir, const Overrides& extra) {
  Overrides o = {
      {"output_dir", output_dir.string()}, {"max_steps_per_epoch", "6"}, {"batch_size", "2"},
      {"tokenizer.max_seq_len", "64"},     {"num_threads", "1"},         {"log_every_n_steps", "1"},
      {"log_peak_memory_stats", "false"}};
  for (const auto& [k, v] : extra) o[k] = v;
  return o;
}

std::string demo_command(const rr_fs::path& output_dir, const Overrides& extra) {
  return run_command("full_finetune_single_device", "demo/tiny_full",
                     demo_overrides(output_dir, extra));
}

std::vector<std::pair<int64_t, double>> printed_steps(const std::string& stdout_text) {
  std::vector<std::pair<int64_t, double>> v;
  static const std::regex re(R"(Step (\d+) \| loss:([-0-9.naif]+))");
  for (auto it = std::sregex_iterator(stdout_text.begin(), stdout_text.end(), re);
       it != std::sregex_iterator(); ++it)
    v.push_back({std::stoll((*it)[1]), std::stod((*it)[2])});
  return v;
}

std::vector<std::string> complete_looking_checkpoints(const rr_fs::path& output_dir) {
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

pid_t spawn_in_background(const std::string& command, const rr_fs::path& scratch,
                          const std::string& prefix) {
  rr_fs::create_directories(scratch);
  const std::string cmd = "cd " + shell_quote(source_dir()) + " && " + prefix + "exec " + command +
                          " >" + shell_quote(scratch / "stdout.txt") + " 2>" +
                          shell_quote(scratch / "stderr.txt");
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

SpawnedRun::SpawnedRun(const std::string& command, const rr_fs::path& scratch)
    : pid_(spawn_in_background(command, scratch, kPassiveWait)) {}

SpawnedRun::~SpawnedRun() {
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    wait();
  }
}

bool SpawnedRun::wait_for_file(const rr_fs::path& path, std::chrono::seconds timeout) {
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

bool SpawnedRun::kill9() {
  if (!reaped_) ::kill(pid_, SIGKILL);
  wait();
  return WIFSIGNALED(status_) && WTERMSIG(status_) == SIGKILL;
}

void SpawnedRun::wait() {
  if (reaped_) return;
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  status_ = status;
  reaped_ = true;
}

}  // namespace fusetune::testing
