#include "fusetune/kernels/cpu/gemm_peak.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/util/error.h"

namespace fusetune::kernels {

double measure_peak_gemm_gflops(int64_t n) {
  FT_CHECK(n >= 1 && n <= 16384,
           "measure_peak_gemm_gflops: n=" + std::to_string(n) + " outside [1, 16384]");
  using Clock = std::chrono::steady_clock;
  const size_t nn = static_cast<size_t>(n * n);
  std::vector<float> a(nn), b(nn), c(nn, 0.0f);
  for (size_t i = 0; i < nn; ++i) {  // small values: no overflow, no denormals
    a[i] = static_cast<float>(i % 7) * 0.125f - 0.375f;
    b[i] = static_cast<float>(i % 5) * 0.25f - 0.5f;
  }
  const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * n;
  auto one_call = [&] {
    const auto t0 = Clock::now();
    gemm<float>(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  one_call();  // warm-up: pages, BLAS buffers, thread pool
  double best = 0.0;
  const auto start = Clock::now();
  for (int calls = 0;; ++calls) {
    const double s = one_call();
    if (s > 0.0) best = std::max(best, flops / s * 1e-9);
    if (calls >= 2 && std::chrono::duration<double>(Clock::now() - start).count() >= 0.2) break;
  }
  return best;
}

}  // namespace fusetune::kernels
