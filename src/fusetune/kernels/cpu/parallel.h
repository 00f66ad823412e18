#pragma once
// Internal helpers shared by the CPU kernels: when to go parallel, and deterministic column
// reductions. Not part of the kernel contract (kernels.h).
//
// Determinism: every partition here depends only on the problem shape, never on the thread
// count, and partial results are combined in a fixed order. So results are bitwise identical
// across runs and across thread counts.
#include <algorithm>
#include <cstdint>
#include <vector>

namespace fusetune::kernels::detail {

// Below this many elements a loop runs on one thread: an OpenMP fork/join costs a few
// microseconds, more than the loop itself.
inline constexpr int64_t kParallelMin = 32768;

// Rows per chunk when summing a [rows, cols] array over its rows: chunks of at least 16K
// elements (so the per-chunk partial row is worth it), at most 64 chunks (bounds the partial
// buffer to 64 rows of doubles while leaving work for up to 64 threads).
inline int64_t chunk_rows(int64_t rows, int64_t cols) {
  constexpr int64_t kChunkElems = 16384, kMaxChunks = 64;
  const int64_t by_size = std::max<int64_t>(1, kChunkElems / std::max<int64_t>(1, cols));
  const int64_t by_count = (rows + kMaxChunks - 1) / kMaxChunks;
  return std::max(by_size, by_count);
}

inline int64_t num_chunks(int64_t rows, int64_t chunk) { return (rows + chunk - 1) / chunk; }

// out[j] = sum over c of partial[c * cols + j], c = 0, 1, ... in order; parallel over j.
template <class T>
void combine_partials(const std::vector<double>& partial, int64_t nchunks, int64_t cols, T* out) {
#pragma omp parallel for schedule(static) if (nchunks * cols >= kParallelMin)
  for (int64_t j = 0; j < cols; ++j) {
    double s = 0.0;
    for (int64_t c = 0; c < nchunks; ++c) s += partial[c * cols + j];
    out[j] = static_cast<T>(s);
  }
}

// out[j] = sum over r of f(r, j), for j < cols, accumulated in double. Rows are split into
// fixed chunks; each chunk streams its rows contiguously into a partial row of doubles.
// Short, wide inputs (few rows) are instead split into column blocks, each summed over all
// rows by one thread, which needs no partial buffer.
template <class T, class F>
void column_sum(int64_t rows, int64_t cols, T* out, F f) {
  if (cols <= 0) return;
  const bool par = rows * cols >= kParallelMin;
  constexpr int64_t kBlock = 256;  // columns per block on the short-wide path
  if (rows <= 16 && cols >= 2 * kBlock) {
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
  const int64_t chunk = chunk_rows(rows, cols);
  const int64_t nchunks = num_chunks(rows, chunk);
  std::vector<double> partial(static_cast<size_t>(std::max<int64_t>(nchunks, 1) * cols), 0.0);
#pragma omp parallel for schedule(static) if (par)
  for (int64_t c = 0; c < nchunks; ++c) {
    double* acc = partial.data() + c * cols;
    const int64_t r1 = std::min(rows, (c + 1) * chunk);
    for (int64_t r = c * chunk; r < r1; ++r) {
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) acc[j] += f(r, j);
    }
  }
  combine_partials(partial, nchunks, cols, out);
}

}  // namespace fusetune::kernels::detail
