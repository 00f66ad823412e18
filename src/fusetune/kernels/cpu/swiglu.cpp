// SwiGLU forward and backward: one vectorized, OpenMP-parallel pass each (kernels/cpu/swiglu.h).
#include "fusetune/kernels/cpu/swiglu.h"

#include "fusetune/kernels/cpu/parallel.h"
#include "fusetune/kernels/cpu/vexp.h"

namespace fusetune::kernels {

template <class T>
void swiglu(const T* g, const T* u, T* out, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : n >= detail::kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T gi = g[i], ui = u[i];
    out[i] = (gi / (T(1) + detail::vexp(-gi))) * ui;
  }
}

template <class T>
void swiglu_backward(const T* g, const T* u, const T* dy, T* dg, T* du, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : n >= detail::kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    // All loads before the stores, so an output may share memory with an input.
    const T gi = g[i], ui = u[i], dyi = dy[i];
    const T e1 = T(1) + detail::vexp(-gi);
    const T s = T(1) / e1;
    const T silu = gi / e1;
    const T dsilu = dyi * ui;
    dg[i] = dsilu * (s * (T(1) + gi * (T(1) - s)));
    du[i] = dyi * silu;
  }
}

template void swiglu<float>(const float*, const float*, float*, int64_t);
template void swiglu<double>(const double*, const double*, double*, int64_t);
template void swiglu_backward<float>(const float*, const float*, const float*, float*, float*,
                                     int64_t);
template void swiglu_backward<double>(const double*, const double*, const double*, double*, double*,
                                      int64_t);

}  // namespace fusetune::kernels
