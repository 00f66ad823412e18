// Reductions: deterministic for any thread count (fixed partitions, fixed combine order),
// accumulated in double.
#include <algorithm>
#include <string>
#include <vector>

#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/kernels/cpu/parallel.h"
#include "fusetune/util/error.h"

namespace fusetune::kernels {

template <class T>
void sum_to_suffix(const T* x, T* out, int64_t n, int64_t nb) {
  FT_CHECK(n >= 0 && nb >= 1 && n % nb == 0, "sum_to_suffix: suffix length " + std::to_string(nb) +
                                                 " does not divide the element count " +
                                                 std::to_string(n));
  detail::column_sum(n / nb, nb, out,
                     [x, nb](int64_t r, int64_t j) { return static_cast<double>(x[r * nb + j]); });
}

template <class T>
double sum_all(const T* x, int64_t n) {
  // Fixed 16K-element chunks (not one per thread) so the result does not depend on the thread
  // count; chunk sums are added in chunk order.
  constexpr int64_t kChunk = 16384;
  if (n <= 0) return 0.0;
  const int64_t nchunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(nchunks));
#pragma omp parallel for schedule(static) if (n >= detail::kParallelMin)
  for (int64_t c = 0; c < nchunks; ++c) {
    const int64_t i1 = std::min(n, (c + 1) * kChunk);
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = c * kChunk; i < i1; ++i) s += static_cast<double>(x[i]);
    partial[c] = s;
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

template void sum_to_suffix<float>(const float*, float*, int64_t, int64_t);
template void sum_to_suffix<double>(const double*, double*, int64_t, int64_t);
template double sum_all<float>(const float*, int64_t);
template double sum_all<double>(const double*, int64_t);

}  // namespace fusetune::kernels
