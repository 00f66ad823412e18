#pragma once
// Row helpers shared by softmax/log_softmax and the fused linear + cross-entropy kernel, so
// both compute exp and its row sums the same way (and the fused loss matches eager).
#include <algorithm>
#include <cstdint>
#include <limits>

#include "fusetune/kernels/cpu/vexp.h"

namespace fusetune::kernels::detail {

template <class T>
inline T row_max(const T* x, int64_t cols) {
  T m = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < cols; ++j) m = x[j] > m ? x[j] : m;
  // clang starts an OpenMP max reduction's lanes at lowest() (GCC: -inf), so a fully masked
  // row (all -inf) reduces to lowest(), not -inf: recount that rare row without the pragma.
  if (m == std::numeric_limits<T>::lowest()) {
    m = -std::numeric_limits<T>::infinity();
    for (int64_t j = 0; j < cols; ++j) m = x[j] > m ? x[j] : m;
  }
  return m;
}

// sum_j exp(x_j - m), also storing the exponentials in e unless e is null. Blocks of 512 are
// summed in T across vector lanes and the block sums in double: a double accumulator inside
// the float exp loop made GCC emit scalar code, 15x slower.
template <class T>
inline double sum_exp(const T* x, T m, T* e, int64_t n) {
  constexpr int64_t kBlock = 512;
  double total = 0.0;
  for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
    const int64_t j1 = std::min(n, j0 + kBlock);
    T s = T(0);
    if (e != nullptr) {
#pragma omp simd reduction(+ : s)
      for (int64_t j = j0; j < j1; ++j) {
        const T v = detail::vexp(x[j] - m);
        e[j] = v;
        s += v;
      }
    } else {
#pragma omp simd reduction(+ : s)
      for (int64_t j = j0; j < j1; ++j) s += detail::vexp(x[j] - m);
    }
    total += static_cast<double>(s);
  }
  return total;
}

// sum_j x_j, summed like sum_exp: blocks of 512 in T across vector lanes, the block sums in
// double (a double accumulator in the loop would make it scalar).
template <class T>
inline double row_sum(const T* x, int64_t n) {
  constexpr int64_t kBlock = 512;
  double total = 0.0;
  for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
    const int64_t j1 = std::min(n, j0 + kBlock);
    T s = T(0);
#pragma omp simd reduction(+ : s)
    for (int64_t j = j0; j < j1; ++j) s += x[j];
    total += static_cast<double>(s);
  }
  return total;
}

}  // namespace fusetune::kernels::detail
