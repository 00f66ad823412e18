#pragma once
// Timing helpers of the benchmarks: a clock that reads wall or process CPU seconds, and the
// median the tables print.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <vector>

namespace fusetune::bench {

// Seconds on a monotonic clock: wall time, or with `cpu_time` the process's CPU time (with one
// thread, the time it ran: steadier on a machine that other work shares; caches stay shared).
inline double bench_clock_seconds(bool cpu_time) {
  if (!cpu_time)
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// The middle value (the upper middle of an even count).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace fusetune::bench
