#pragma once
// Seconds as double: wall-clock time since the Unix epoch (for logs and event files) and a
// monotonic clock (for durations).
#include <chrono>

namespace fusetune {

inline double unix_now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

inline double steady_now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace fusetune
