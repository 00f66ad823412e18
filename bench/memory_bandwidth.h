#pragma once
// The machine's memory bandwidth, measured the way a weight-bound kernel uses memory: all
// threads stream a buffer much larger than the caches. Read: a sum over 1 GiB; copy: 512 MiB
// into another 512 MiB (counted as read + write bytes). Best of `repeats`.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

namespace fusetune::bench {

struct Bandwidth {
  double read_gbs = 0, copy_gbs = 0;
};

inline Bandwidth measure_bandwidth(int repeats = 5) {
  constexpr size_t kFloats = size_t(1) << 28;  // 1 GiB
  std::vector<float> a(kFloats, 1.0f);
  Bandwidth b;
  volatile double sink = 0;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    double s = 0;
    // Independent partial sums (a vector's worth per row of acc), so the loop vectorizes
    // without reassociating a single sum, and streams at the memory's pace.
#pragma omp parallel reduction(+ : s)
    {
      const size_t n = size_t(omp_get_num_threads()), t = size_t(omp_get_thread_num());
      const size_t lo = kFloats * t / n / 32 * 32, hi = kFloats * (t + 1) / n / 32 * 32;
      float acc[32] = {};
      for (size_t i = lo; i < hi; i += 32)
        for (size_t j = 0; j < 32; ++j) acc[j] += a[i + j];
      for (float x : acc) s += x;
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    sink = sink + s;
    b.read_gbs = std::max(b.read_gbs, double(kFloats * sizeof(float)) / dt / 1e9);
  }
  const size_t half = kFloats / 2;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel
    {
      const size_t n = size_t(omp_get_num_threads()), t = size_t(omp_get_thread_num());
      const size_t lo = half * t / n, hi = half * (t + 1) / n;
      std::memcpy(a.data() + half + lo, a.data() + lo, (hi - lo) * sizeof(float));
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    b.copy_gbs = std::max(b.copy_gbs, 2.0 * double(half * sizeof(float)) / dt / 1e9);
  }
  return b;
}

}  // namespace fusetune::bench
