#include "fusetune/kernels/cpu/peft_ops.h"

#include <cmath>

#include "fusetune/kernels/cpu/parallel.h"
#include "fusetune/util/mix64.h"

namespace fusetune::kernels {
template <class T>
void dropout(const T* x, T* out, int64_t n, double p, uint64_t seed, uint64_t salt) {
  const uint64_t key = mix64(mix64(seed + kMix64Gamma) ^ (salt * 0xd1b54a32d192ed03ull));
  const T keep_scale = T(1.0 / (1.0 - p));
#pragma omp parallel for schedule(static) if (n >= detail::kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const double u = double(mix64(key + uint64_t(i)) >> 11) * (1.0 / 9007199254740992.0);
    out[i] = u >= p ? x[i] * keep_scale : T(0);
  }
}

template <class T>
void row_inv_norm(const T* w, T* out, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols >= detail::kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0;
    for (int64_t j = 0; j < cols; ++j) s += double(w[r * cols + j]) * double(w[r * cols + j]);
    out[r] = T(1.0 / std::max(std::sqrt(s), 1e-30));
  }
}

template void dropout<float>(const float*, float*, int64_t, double, uint64_t, uint64_t);
template void dropout<double>(const double*, double*, int64_t, double, uint64_t, uint64_t);
template void row_inv_norm<float>(const float*, float*, int64_t, int64_t);
template void row_inv_norm<double>(const double*, double*, int64_t, int64_t);

}  // namespace fusetune::kernels
