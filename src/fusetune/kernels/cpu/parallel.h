#pragma once
// Internal helpers shared by the CPU kernels: when to go parallel, and a deterministic
// column reduction. Not part of the kernel contract (kernels.h).
#include <algorithm>
#include <cstdint>
#include <vector>

namespace fusetune::kernels::detail {

// Below this many elements a loop runs on one thread: an OpenMP fork/join costs a few
// microseconds, more than the loop itself.
inline constexpr int64_t kParallelMin = 32768;

// out[j] = sum over r of f(r, j), for j < cols, accumulated in double.
//
// Deterministic and independent of the thread count: the partition depends only on
// (rows, cols). Wide outputs are split into column blocks, each summed over r = 0..rows-1 in
// order by one thread. Narrow outputs (where column blocks would leave threads idle) are split
// into fixed row chunks whose partial sums are combined in chunk order.
template <class T, class F>
void column_sum(int64_t rows, int64_t cols, T* out, F f) {
  constexpr int64_t kBlock = 64;          // columns per block (512 bytes of double accumulators)
  constexpr int64_t kChunkElems = 16384;  // elements per row chunk on the narrow path
  if (cols <= 0) return;
  const bool par = rows * cols >= kParallelMin;
  if (cols >= 2 * kBlock) {
    const int64_t nblocks = (cols + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (par)
    for (int64_t blk = 0; blk < nblocks; ++blk) {
      const int64_t c0 = blk * kBlock;
      const int64_t w = std::min(kBlock, cols - c0);
      double acc[kBlock] = {};
      for (int64_t r = 0; r < rows; ++r) {
#pragma omp simd
        for (int64_t j = 0; j < w; ++j) acc[j] += f(r, c0 + j);
      }
      for (int64_t j = 0; j < w; ++j) out[c0 + j] = static_cast<T>(acc[j]);
    }
    return;
  }
  const int64_t chunk_rows = std::max<int64_t>(1, kChunkElems / cols);
  const int64_t nchunks = (rows + chunk_rows - 1) / chunk_rows;
  std::vector<double> partial(static_cast<size_t>(std::max<int64_t>(nchunks, 1) * cols), 0.0);
#pragma omp parallel for schedule(static) if (par)
  for (int64_t c = 0; c < nchunks; ++c) {
    double* acc = partial.data() + c * cols;
    const int64_t r1 = std::min(rows, (c + 1) * chunk_rows);
    for (int64_t r = c * chunk_rows; r < r1; ++r) {
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) acc[j] += f(r, j);
    }
  }
  for (int64_t j = 0; j < cols; ++j) {
    double s = 0.0;
    for (int64_t c = 0; c < nchunks; ++c) s += partial[c * cols + j];
    out[j] = static_cast<T>(s);
  }
}

}  // namespace fusetune::kernels::detail
