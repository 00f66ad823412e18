// RMSNorm (Llama), plain (kernels.h) and fused with the residual add (rmsnorm_fused.h): y = x /
// sqrt(mean(x^2) + eps) * w over rows of length D. The mean of squares and the backward's row dot
// product accumulate in double.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/kernels/cpu/parallel.h"
#include "fusetune/kernels/cpu/rmsnorm_fused.h"
#include "fusetune/util/error.h"

namespace fusetune::kernels {
namespace {

void check_sizes(const char* op, int64_t rows, int64_t D, double eps) {
  FT_CHECK(rows >= 0 && D >= 1, std::string(op) + ": bad shape rows=" + std::to_string(rows) +
                                    " D=" + std::to_string(D));
  FT_CHECK(eps >= 0.0, std::string(op) + ": eps must be >= 0, got " + std::to_string(eps));
}

// 1 / sqrt(mean(x^2) + eps) for one row.
template <class T>
double inv_rms(const T* x, int64_t D, double eps) {
  double ss = 0.0;
#pragma omp simd reduction(+ : ss)
  for (int64_t j = 0; j < D; ++j) ss += static_cast<double>(x[j]) * static_cast<double>(x[j]);
  return 1.0 / std::sqrt(ss / static_cast<double>(D) + eps);
}

}  // namespace

template <class T>
void rmsnorm_forward(const T* x, const T* w, T* y, int64_t rows, int64_t D, double eps) {
  check_sizes("rmsnorm_forward", rows, D, eps);
#pragma omp parallel for schedule(static) if (rows * D >= detail::kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * D;
    T* yr = y + r * D;
    const T rstd = static_cast<T>(inv_rms(xr, D, eps));
    // (x * rstd) * w, the order of Hugging Face's LlamaRMSNorm.
#pragma omp simd
    for (int64_t j = 0; j < D; ++j) yr[j] = (xr[j] * rstd) * w[j];
  }
}

namespace {

// With r = rstd: dx_k = r w_k dy_k - (r^3 / D) x_k sum_j(dy_j w_j x_j); dw_j = sum_rows dy_j x_j r.
// One pass over x and dy: rows go in fixed chunks (detail::chunk_rows), each chunk adds its
// rows' dw terms into its own partial row of doubles, and the partials are combined in chunk
// order, so dw does not depend on the thread count. With `dres`, dx += dres in the same pass
// (dx may alias dres: a row's dw terms are taken first, and each dres element is read before
// its dx is written).
template <class T>
void backward_rows(const char* op, const T* x, const T* w, const T* dy, const T* dres, T* dx, T* dw,
                   int64_t rows, int64_t D, double eps) {
  check_sizes(op, rows, D, eps);
  const int64_t chunk = detail::chunk_rows(rows, D);
  const int64_t nchunks = detail::num_chunks(rows, chunk);
  std::vector<double> partial(dw != nullptr ? static_cast<size_t>(nchunks * D) : 0, 0.0);
#pragma omp parallel for schedule(static) if (rows * D >= detail::kParallelMin)
  for (int64_t c = 0; c < nchunks; ++c) {
    double* acc = dw != nullptr ? partial.data() + c * D : nullptr;
    const int64_t r1 = std::min(rows, (c + 1) * chunk);
    for (int64_t r = c * chunk; r < r1; ++r) {
      const T* xr = x + r * D;
      const T* dyr = dy + r * D;
      T* dxr = dx + r * D;
      const double rs = inv_rms(xr, D, eps);
      double dot = 0.0;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < D; ++j) {
        dot += static_cast<double>(dyr[j]) * static_cast<double>(w[j]) * static_cast<double>(xr[j]);
      }
      const T a = static_cast<T>(rs);
      const T b = static_cast<T>(rs * rs * rs * dot / static_cast<double>(D));
      if (acc != nullptr) {
#pragma omp simd
        for (int64_t j = 0; j < D; ++j) {
          acc[j] += static_cast<double>(dyr[j]) * static_cast<double>(xr[j]) * rs;
        }
      }
      if (dres == nullptr) {
#pragma omp simd
        for (int64_t j = 0; j < D; ++j) dxr[j] = a * w[j] * dyr[j] - b * xr[j];
      } else {
        const T* dr = dres + r * D;
#pragma omp simd
        for (int64_t j = 0; j < D; ++j) {
          const T g = a * w[j] * dyr[j] - b * xr[j];
          dxr[j] = dr[j] + g;
        }
      }
    }
  }
  if (dw != nullptr) detail::combine_partials(partial, nchunks, D, dw);
}

}  // namespace

template <class T>
void rmsnorm_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, int64_t rows, int64_t D,
                      double eps) {
  backward_rows<T>("rmsnorm_backward", x, w, dy, nullptr, dx, dw, rows, D, eps);
}

template <class T>
void add_rmsnorm_forward(const T* h, const T* x, const T* w, T* s, T* y, int64_t rows, int64_t D,
                         double eps) {
  check_sizes("add_rmsnorm_forward", rows, D, eps);
#pragma omp parallel for schedule(static) if (rows * D >= detail::kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const T* hr = h + r * D;
    const T* xr = x + r * D;
    T* sr = s + r * D;
    T* yr = y + r * D;
#pragma omp simd
    for (int64_t j = 0; j < D; ++j) sr[j] = hr[j] + xr[j];
    // The row of s is still in cache: the norm reads it back instead of reading h and x again.
    const T rstd = static_cast<T>(inv_rms(sr, D, eps));
#pragma omp simd
    for (int64_t j = 0; j < D; ++j) yr[j] = (sr[j] * rstd) * w[j];
  }
}

template <class T>
void rmsnorm_backward_add(const T* x, const T* w, const T* dy, const T* dres, T* dx, T* dw,
                          int64_t rows, int64_t D, double eps) {
  backward_rows<T>("rmsnorm_backward_add", x, w, dy, dres, dx, dw, rows, D, eps);
}

template void rmsnorm_forward<float>(const float*, const float*, float*, int64_t, int64_t, double);
template void rmsnorm_forward<double>(const double*, const double*, double*, int64_t, int64_t,
                                      double);
template void rmsnorm_backward<float>(const float*, const float*, const float*, float*, float*,
                                      int64_t, int64_t, double);
template void rmsnorm_backward<double>(const double*, const double*, const double*, double*,
                                       double*, int64_t, int64_t, double);
template void add_rmsnorm_forward<float>(const float*, const float*, const float*, float*, float*,
                                         int64_t, int64_t, double);
template void add_rmsnorm_forward<double>(const double*, const double*, const double*, double*,
                                          double*, int64_t, int64_t, double);
template void rmsnorm_backward_add<float>(const float*, const float*, const float*, const float*,
                                          float*, float*, int64_t, int64_t, double);
template void rmsnorm_backward_add<double>(const double*, const double*, const double*,
                                           const double*, double*, double*, int64_t, int64_t,
                                           double);

}  // namespace fusetune::kernels
