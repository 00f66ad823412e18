// Softmax and log-softmax over rows, max-subtracted; row sums accumulate in double (via
// vector-width partial sums over blocks of 512).
//
// A row that is entirely -inf (every key masked) has no distribution. softmax writes zeros
// there (not NaN), log_softmax writes -inf; both backwards then pass zero / dy through, so a
// fully masked row contributes nothing once causal_mask_backward zeroes its positions.
// +inf or NaN inputs propagate as NaN.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/kernels/cpu/parallel.h"
#include "fusetune/kernels/cpu/row_softmax.h"
#include "fusetune/util/error.h"

namespace fusetune::kernels {
using detail::row_max;
using detail::sum_exp;

namespace {

void check_shape(const char* op, int64_t rows, int64_t cols) {
  FT_CHECK(rows >= 0 && cols >= 1, std::string(op) + ": bad shape rows=" + std::to_string(rows) +
                                       " cols=" + std::to_string(cols));
}

bool parallel_rows(int64_t rows, int64_t cols) { return rows * cols >= detail::kParallelMin; }

}  // namespace

template <class T>
void softmax_rows(const T* x, T* y, int64_t rows, int64_t cols) {
  check_shape("softmax_rows", rows, cols);
#pragma omp parallel for schedule(static) if (parallel_rows(rows, cols))
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    const T m = row_max(xr, cols);
    if (m == -std::numeric_limits<T>::infinity()) {
      for (int64_t j = 0; j < cols; ++j) yr[j] = T(0);
      continue;
    }
    const double s = sum_exp(xr, m, yr, cols);
    const T inv = static_cast<T>(1.0 / s);  // s >= 1: the max element contributes exp(0)
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) yr[j] *= inv;
  }
}

template <class T>
void softmax_backward(const T* y, const T* dy, T* dx, int64_t rows, int64_t cols) {
  check_shape("softmax_backward", rows, cols);
#pragma omp parallel for schedule(static) if (parallel_rows(rows, cols))
  for (int64_t r = 0; r < rows; ++r) {
    const T* yr = y + r * cols;
    const T* dyr = dy + r * cols;
    T* dxr = dx + r * cols;
    double dot = 0.0;
#pragma omp simd reduction(+ : dot)
    for (int64_t j = 0; j < cols; ++j) dot += static_cast<double>(dyr[j]) * yr[j];
    const T d = static_cast<T>(dot);
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) dxr[j] = yr[j] * (dyr[j] - d);
  }
}

template <class T>
void log_softmax_rows(const T* x, T* y, int64_t rows, int64_t cols) {
  check_shape("log_softmax_rows", rows, cols);
#pragma omp parallel for schedule(static) if (parallel_rows(rows, cols))
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    const T m = row_max(xr, cols);
    if (m == -std::numeric_limits<T>::infinity()) {
      for (int64_t j = 0; j < cols; ++j) yr[j] = -std::numeric_limits<T>::infinity();
      continue;
    }
    const double s = sum_exp(xr, m, static_cast<T*>(nullptr), cols);
    const T lse = static_cast<T>(std::log(s));
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) yr[j] = (xr[j] - m) - lse;
  }
}

template <class T>
void log_softmax_backward(const T* y, const T* dy, T* dx, int64_t rows, int64_t cols) {
  check_shape("log_softmax_backward", rows, cols);
#pragma omp parallel for schedule(static) if (parallel_rows(rows, cols))
  for (int64_t r = 0; r < rows; ++r) {
    const T* yr = y + r * cols;
    const T* dyr = dy + r * cols;
    T* dxr = dx + r * cols;
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < cols; ++j) s += static_cast<double>(dyr[j]);
    const T st = static_cast<T>(s);
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) dxr[j] = dyr[j] - detail::vexp(yr[j]) * st;
  }
}

#define FT_INSTANTIATE(T)                                                      \
  template void softmax_rows<T>(const T*, T*, int64_t, int64_t);               \
  template void softmax_backward<T>(const T*, const T*, T*, int64_t, int64_t); \
  template void log_softmax_rows<T>(const T*, T*, int64_t, int64_t);           \
  template void log_softmax_backward<T>(const T*, const T*, T*, int64_t, int64_t);
FT_INSTANTIATE(float)
FT_INSTANTIATE(double)
#undef FT_INSTANTIATE

}  // namespace fusetune::kernels
