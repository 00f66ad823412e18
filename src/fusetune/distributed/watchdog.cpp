#include "fusetune/distributed/watchdog.h"

#include <unistd.h>

#include <cstdio>

namespace fusetune::dist {

Watchdog::Watchdog(double timeout_s, std::string who)
    : timeout_s_(timeout_s), who_(std::move(who)), thread_([this] { watch(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Watchdog::arm(const std::string& what) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = true;
    what_ = what;
    deadline_ = std::chrono::steady_clock::now() +
                std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                    std::chrono::duration<double>(timeout_s_));
  }
  cv_.notify_all();
}

void Watchdog::disarm() {
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = false;
}

void Watchdog::watch() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (!armed_) {
      cv_.wait(lock);
      continue;
    }
    const auto deadline = deadline_;
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && armed_ && !stop_ &&
        deadline_ == deadline) {
      // Not an exception: the main thread is blocked inside MPI and cannot unwind.
      std::fprintf(stderr,
                   "fusetune: error: %s: %s did not complete within dist_timeout_seconds "
                   "(%g s): another rank has died or hangs; this rank exits so that the "
                   "launcher stops the others (the last complete checkpoint stays valid)\n",
                   who_.c_str(), what_.c_str(), timeout_s_);
      std::fflush(stderr);
      std::fflush(stdout);
      ::_exit(kWatchdogExitCode);
    }
  }
}

}  // namespace fusetune::dist
