#pragma once
// A deadline on waiting for the other ranks. MPI itself may wait forever when a rank hangs
// (or, with some transports, when it dies), so each collective runs under a watchdog: a
// thread that, when the collective has not finished within the timeout, prints which rank was
// waiting for what (and at which step) and ends the process. The launcher (mpirun, srun) then
// stops the remaining ranks, so no process is left behind.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace fusetune::dist {

class Watchdog {
 public:
  // `who` prefixes the message ("rank 1 of 2"); timeout_s > 0.
  Watchdog(double timeout_s, std::string who);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Starts the clock for `what` ("the gradient all-reduce of step 7").
  void arm(const std::string& what);
  void disarm();
  double timeout_seconds() const { return timeout_s_; }

 private:
  void watch();

  double timeout_s_;
  std::string who_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool armed_ = false;
  bool stop_ = false;
  std::string what_;
  std::chrono::steady_clock::time_point deadline_;
  std::thread thread_;
};

// Arms for the lifetime of a scope.
class WatchdogScope {
 public:
  WatchdogScope(Watchdog* w, const std::string& what) : w_(w) {
    if (w_) w_->arm(what);
  }
  ~WatchdogScope() {
    if (w_) w_->disarm();
  }
  WatchdogScope(const WatchdogScope&) = delete;
  WatchdogScope& operator=(const WatchdogScope&) = delete;

 private:
  Watchdog* w_;
};

// The exit status of a process whose watchdog fired.
inline constexpr int kWatchdogExitCode = 3;

}  // namespace fusetune::dist
