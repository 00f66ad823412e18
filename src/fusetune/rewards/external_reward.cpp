#include "fusetune/rewards/external_reward.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>

#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune {
namespace {

using ScorerClock = std::chrono::steady_clock;

constexpr size_t kScorerStderrTail = 2000;  // bytes of the scorer's stderr kept for an error

std::string scorer_name(const std::string& command) { return "reward command '" + command + "'"; }

// A child process running `sh -c command` in its own process group, with pipes to its
// stdin, stdout and stderr.
struct ScorerProcess {
  pid_t pid = -1;
  int in = -1, out = -1, err = -1;
};

ScorerProcess spawn_scorer(const std::string& command) {
  int pin[2], pout[2], perr[2];
  FT_CHECK(pipe(pin) == 0 && pipe(pout) == 0 && pipe(perr) == 0,
           "cannot create pipes for the " + scorer_name(command) + ": " + std::strerror(errno));
  const pid_t pid = fork();
  FT_CHECK(pid >= 0, "cannot start the " + scorer_name(command) + ": " + std::strerror(errno));
  if (pid == 0) {
    setpgid(0, 0);  // so that a timeout kills the shell and what it started
    dup2(pin[0], 0);
    dup2(pout[1], 1);
    dup2(perr[1], 2);
    for (int fd : {pin[0], pin[1], pout[0], pout[1], perr[0], perr[1]}) close(fd);
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  setpgid(pid, pid);  // also here: whichever runs first
  close(pin[0]);
  close(pout[1]);
  close(perr[1]);
  for (int fd : {pin[1], pout[0], perr[0]}) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return {pid, pin[1], pout[0], perr[0]};
}

// Reads what `fd` has now into `to`; false at end of file.
bool drain_pipe(int fd, std::string& to) {
  char buf[65536];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n > 0) {
      to.append(buf, size_t(n));
      continue;
    }
    if (n == 0) return false;
    return errno == EAGAIN || errno == EINTR;
  }
}

// Feeds `input`, collects stdout and stderr, and reaps the child; the exit status, or an
// Error when the deadline passes first (the process group killed).
int talk_to_scorer(ScorerProcess& c, const std::string& command, const std::string& input,
                   double timeout_s, std::string& out, std::string& err) {
  const auto deadline = ScorerClock::now() + std::chrono::duration_cast<ScorerClock::duration>(
                                                 std::chrono::duration<double>(timeout_s));
  auto timed_out = [&] {
    kill(-c.pid, SIGKILL);
    for (int fd : {c.in, c.out, c.err})
      if (fd >= 0) close(fd);
    waitpid(c.pid, nullptr, 0);
    return Error("the " + scorer_name(command) + " did not finish within its timeout of " +
                 std::to_string(timeout_s) + " s (rewards.external.timeout_s) and was killed");
  };
  size_t written = 0;
  if (input.empty()) close(std::exchange(c.in, -1));
  while (c.out >= 0 || c.err >= 0) {
    pollfd fds[3];
    int n = 0;
    for (int fd : {c.in, c.out, c.err})
      if (fd >= 0) fds[n++] = {fd, short(fd == c.in ? POLLOUT : POLLIN), 0};
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - ScorerClock::now());
    if (left.count() <= 0) throw timed_out();
    if (poll(fds, nfds_t(n), int(std::min<int64_t>(left.count(), 1000))) < 0 && errno != EINTR)
      throw Error("poll failed while talking to the " + scorer_name(command));
    for (int i = 0; i < n; ++i) {
      if (fds[i].revents == 0) continue;
      if (fds[i].fd == c.in) {
        const ssize_t w = write(c.in, input.data() + written, input.size() - written);
        if (w > 0) written += size_t(w);
        // EPIPE: the scorer stopped reading; what it answers decides what is wrong.
        if ((w < 0 && errno != EAGAIN && errno != EINTR) || written == input.size())
          close(std::exchange(c.in, -1));
      } else {
        std::string& to = fds[i].fd == c.out ? out : err;
        int& fd = fds[i].fd == c.out ? c.out : c.err;
        if (!drain_pipe(fd, to)) close(std::exchange(fd, -1));
        if (err.size() > 4 * kScorerStderrTail) err.erase(0, err.size() - kScorerStderrTail);
      }
    }
  }
  if (c.in >= 0) close(std::exchange(c.in, -1));
  int status = 0;
  while (waitpid(c.pid, &status, WNOHANG) == 0) {
    if (ScorerClock::now() >= deadline) throw timed_out();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return status;
}

std::string scorer_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status));
  return "ended abnormally";
}

std::vector<double> parse_scorer_output(const std::string& command, const std::string& out,
                                        size_t expected) {
  std::vector<double> scores;
  std::string_view text(out);
  if (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  if (!text.empty() || expected > 0) {
    for_each_line(text, [&](std::string_view raw, size_t line_no) {
      const std::string line = trim(raw);
      char* end = nullptr;
      const double v = std::strtod(line.c_str(), &end);
      FT_CHECK(!line.empty() && end == line.c_str() + line.size() && std::isfinite(v),
               "the " + scorer_name(command) + " answered '" + line.substr(0, 80) + "' on line " +
                   std::to_string(line_no) + " of its output (completion " +
                   std::to_string(line_no) + "): expected one finite number per line");
      scores.push_back(v);
    });
  }
  FT_CHECK(scores.size() == expected, "the " + scorer_name(command) + " answered " +
                                          std::to_string(scores.size()) + " lines for " +
                                          std::to_string(expected) +
                                          " completions: expected one number per line");
  return scores;
}

}  // namespace

std::string external_reward_json(const ScoredCompletion& c) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : c.columns) j[k] = v;
  j["prompt"] = c.prompt;
  j["completion"] = c.completion;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::vector<double> run_external_reward(const ExternalReward& reward,
                                        const std::vector<ScoredCompletion>& batch) {
  FT_CHECK(!reward.command.empty(), "rewards.external.command is empty");
  FT_CHECK(reward.timeout_s > 0, "rewards.external.timeout_s must be > 0");
  // A scorer that exits before reading everything must not kill us with SIGPIPE: its answer
  // (or exit status) is the error to report. Process-wide, unless someone set a handler.
  struct sigaction old {};
  if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) signal(SIGPIPE, SIG_IGN);
  std::string input;
  for (const ScoredCompletion& c : batch) input += external_reward_json(c) + "\n";
  ScorerProcess child = spawn_scorer(reward.command);
  std::string out, err;
  const int status = talk_to_scorer(child, reward.command, input, reward.timeout_s, out, err);
  if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
    if (err.size() > kScorerStderrTail) err.erase(0, err.size() - kScorerStderrTail);
    throw Error("the " + scorer_name(reward.command) + " " + scorer_status(status) +
                (trim(err).empty() ? std::string() : "; its stderr ends: " + trim(err)));
  }
  return parse_scorer_output(reward.command, out, batch.size());
}

}  // namespace fusetune
