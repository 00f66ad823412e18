// Elementwise kernels: one pass over memory each, vectorized, OpenMP-parallel above
// kParallelMin elements.
#include <cmath>
#include <string>

#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/kernels/cpu/parallel.h"
#include "fusetune/kernels/cpu/vexp.h"
#include "fusetune/util/error.h"

namespace fusetune::kernels {
namespace {

using detail::kParallelMin;

void check_broadcast(const char* op, int64_t n, int64_t nb) {
  FT_CHECK(n >= 0 && nb >= 1 && n % nb == 0,
           std::string(op) + ": broadcast length " + std::to_string(nb) +
               " does not divide the element count " + std::to_string(n));
}

// out = op(a, b) with b repeating every nb elements (same shape, scalar, or suffix row).
template <class T, class Op>
void binary(const char* name, const T* a, const T* b, T* out, int64_t n, int64_t nb, Op op) {
  if (n == 0) return;
  check_broadcast(name, n, nb);
  if (nb == n) {
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) out[i] = op(a[i], b[i]);
  } else if (nb == 1) {
    const T s = b[0];
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) out[i] = op(a[i], s);
  } else {
    const int64_t rows = n / nb;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (int64_t r = 0; r < rows; ++r) {
      const T* ar = a + r * nb;
      T* orow = out + r * nb;
#pragma omp simd
      for (int64_t j = 0; j < nb; ++j) orow[j] = op(ar[j], b[j]);
    }
  }
}

}  // namespace

template <class T>
void add(const T* a, const T* b, T* out, int64_t n, int64_t nb) {
  binary("add", a, b, out, n, nb, [](T x, T y) { return x + y; });
}

template <class T>
void mul(const T* a, const T* b, T* out, int64_t n, int64_t nb) {
  binary("mul", a, b, out, n, nb, [](T x, T y) { return x * y; });
}

template <class T>
void scale(const T* a, T s, T* out, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] * s;
}

template <class T>
void silu(const T* x, T* out, int64_t n) {
  // x / (1 + e^-x): for x -> -inf, e^-x -> inf and the quotient -> -0, never NaN.
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] / (T(1) + detail::vexp(-x[i]));
}

template <class T>
void silu_backward(const T* x, const T* dy, T* dx, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T s = T(1) / (T(1) + detail::vexp(-x[i]));
    dx[i] = dy[i] * (s * (T(1) + x[i] * (T(1) - s)));
  }
}

template <class T>
void gelu_tanh(const T* x, T* out, int64_t n) {
  const T k0 = T(0.7978845608028654), k1 = T(0.044715);  // sqrt(2 / pi), PyTorch's constant
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T v = x[i];
    out[i] = T(0.5) * v * (T(1) + std::tanh(k0 * (v + k1 * v * v * v)));
  }
}

template <class T>
void gelu_tanh_backward(const T* x, const T* dy, T* dx, int64_t n) {
  const T k0 = T(0.7978845608028654), k1 = T(0.044715);
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T v = x[i], t = std::tanh(k0 * (v + k1 * v * v * v));
    const T d = T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * k0 * (T(1) + T(3) * k1 * v * v);
    dx[i] = dy[i] * d;
  }
}

template <class T>
void softcap(const T* x, T cap, T* out, int64_t n) {
  const T inv = T(1) / cap;
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = std::tanh(x[i] * inv) * cap;
}

template <class T>
void softcap_backward(const T* y, const T* dy, T cap, T* dx, int64_t n) {
  const T inv = T(1) / cap;
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T t = y[i] * inv;
    dx[i] = dy[i] * (T(1) - t * t);
  }
}

#define FT_INSTANTIATE(T)                                               \
  template void add<T>(const T*, const T*, T*, int64_t, int64_t);       \
  template void mul<T>(const T*, const T*, T*, int64_t, int64_t);       \
  template void scale<T>(const T*, T, T*, int64_t);                     \
  template void silu<T>(const T*, T*, int64_t);                         \
  template void silu_backward<T>(const T*, const T*, T*, int64_t);      \
  template void gelu_tanh<T>(const T*, T*, int64_t);                    \
  template void gelu_tanh_backward<T>(const T*, const T*, T*, int64_t); \
  template void softcap<T>(const T*, T, T*, int64_t);                   \
  template void softcap_backward<T>(const T*, const T*, T, T*, int64_t);
FT_INSTANTIATE(float)
FT_INSTANTIATE(double)
#undef FT_INSTANTIATE

}  // namespace fusetune::kernels
