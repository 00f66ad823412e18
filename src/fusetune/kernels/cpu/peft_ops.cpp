#include "fusetune/kernels/cpu/peft_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "fusetune/core/tensor.h"
#include "fusetune/kernels/cpu/kernels.h"

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

template <class T>
void row_inv_norm_low_rank(const T* w, const T* a, const T* bs, T* out, int64_t rows, int64_t cols,
                           int64_t r) {
  constexpr int64_t kTileRows = 256;
  const int64_t tr = std::min(rows, kTileRows);
  Tensor tile_buf = Tensor::empty({tr, cols}, dtype_of<T>());  // counted scratch
  T* tile = tile_buf.data<T>();
  for (int64_t r0 = 0; r0 < rows; r0 += tr) {
    const int64_t t = std::min(tr, rows - r0);
    std::memcpy(tile, w + r0 * cols, sizeof(T) * size_t(t * cols));
    gemm<T>(false, false, t, cols, r, T(1), bs + r0 * r, r, a, cols, T(1), tile, cols);
    row_inv_norm<T>(tile, out + r0, t, cols);
  }
}

template void dropout<float>(const float*, float*, int64_t, double, uint64_t, uint64_t);
template void dropout<double>(const double*, double*, int64_t, double, uint64_t, uint64_t);
template void row_inv_norm<float>(const float*, float*, int64_t, int64_t);
template void row_inv_norm<double>(const double*, double*, int64_t, int64_t);
template void row_inv_norm_low_rank<float>(const float*, const float*, const float*, float*,
                                           int64_t, int64_t, int64_t);
template void row_inv_norm_low_rank<double>(const double*, const double*, const double*, double*,
                                            int64_t, int64_t, int64_t);

}  // namespace fusetune::kernels
