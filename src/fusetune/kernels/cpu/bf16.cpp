#include "fusetune/kernels/cpu/bf16.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "fusetune/core/tensor.h"
#include "fusetune/kernels/cpu/decode_gemv.h"
#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/kernels/cpu/nf4.h"
#include "fusetune/kernels/cpu/parallel.h"
#include "fusetune/util/error.h"

namespace fusetune::kernels {

void bf16_to_f32_array(const uint16_t* x, float* out, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= detail::kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = uint32_t(x[i]) << 16;
    std::memcpy(out + i, &bits, 4);
  }
}

void f32_to_bf16_array(const float* x, uint16_t* out, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : n >= detail::kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, 4);
    // Round to nearest even; a NaN keeps a set quiet bit so it cannot round to infinity.
    const bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
    const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    out[i] = uint16_t(nan ? ((bits >> 16) | 0x40u) : rounded);
  }
}

bool holds_bf16_values(const float* x, int64_t n) {
  uint32_t low = 0;
#pragma omp parallel for simd reduction(|                                    \
                                        : low) schedule(static) if (parallel \
                                                                    : n >= detail::kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, 4);
    low |= bits & 0xFFFFu;
  }
  return low == 0;
}

void embedding_backward_bf16(const float* dy, const int32_t* ids, uint16_t* dtable, int64_t n,
                             int64_t D, int64_t V, const std::vector<int32_t>* clear_rows) {
  for (int64_t i = 0; i < n; ++i)
    FT_CHECK(ids[i] >= 0 && ids[i] < V,
             "embedding_backward: token id " + std::to_string(ids[i]) + " at position " +
                 std::to_string(i) + " is outside the vocabulary of size " + std::to_string(V));
  if (!clear_rows)
    std::memset(dtable, 0, sizeof(uint16_t) * size_t(V * D));  // bf16 +0
  else
    for (int32_t r : *clear_rows)
      std::memset(dtable + int64_t(r) * D, 0, sizeof(uint16_t) * size_t(D));
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return ids[a] < ids[b]; });
  std::vector<int64_t> starts;  // where each id's run of positions begins in `order`
  for (int64_t k = 0; k < n; ++k)
    if (k == 0 || ids[order[size_t(k)]] != ids[order[size_t(k - 1)]]) starts.push_back(k);
  starts.push_back(n);
  const int64_t groups = int64_t(starts.size()) - 1;
#pragma omp parallel if (n * D >= detail::kParallelMin)
  {
    std::vector<float> row(static_cast<size_t>(D));
#pragma omp for schedule(static)
    for (int64_t g = 0; g < groups; ++g) {
      std::fill(row.begin(), row.end(), 0.0f);
      for (int64_t k = starts[size_t(g)]; k < starts[size_t(g + 1)]; ++k) {
        const float* src = dy + order[size_t(k)] * D;
#pragma omp simd
        for (int64_t j = 0; j < D; ++j) row[size_t(j)] += src[j];
      }
      uint16_t* dst = dtable + int64_t(ids[order[size_t(starts[size_t(g)])]]) * D;
      for (int64_t j = 0; j < D; ++j) dst[j] = f32_to_bf16(row[size_t(j)]);
    }
  }
}

int64_t bf16_tile_rows(int64_t rows, int64_t cols) {
  const int64_t by_bytes = (int64_t(1) << 18) / std::max<int64_t>(1, cols);  // 1 MiB of fp32
  return std::max<int64_t>(1, std::min(rows, std::max<int64_t>(256, by_bytes)));
}

int64_t bf16_weight_tile_rows(bool trans_b, int64_t rows, int64_t cols) {
  if (!trans_b) return bf16_tile_rows(rows, cols);
  const int64_t by_bytes = (int64_t(1) << 22) / std::max<int64_t>(1, cols);  // 16 MiB of fp32
  return std::max<int64_t>(1, std::min(rows, std::max<int64_t>(512, by_bytes)));
}

void gemm_bf16_weight(bool trans_b, int64_t M, int64_t N, int64_t K, const float* A,
                      const uint16_t* B, float* out, float* tile) {
  if (trans_b && M <= kDecodeGemvMaxRows) {  // a decode step's x W^T: W read once, as stored
    decode_gemv_bf16_weight(M, N, K, A, false, B, out, false);
    return;
  }
  const int64_t stored_rows = trans_b ? N : K, stored_cols = trans_b ? K : N;
  const int64_t tr = bf16_weight_tile_rows(trans_b, stored_rows, stored_cols);
  Tensor tile_buf;
  if (!tile) {
    tile_buf = Tensor::empty({tr, stored_cols}, DType::F32);  // counted scratch
    tile = tile_buf.data<float>();
  }
  if (M == 0 || N == 0) return;
  if (K == 0) std::fill(out, out + M * N, 0.0f);
  for (int64_t r0 = 0; r0 < stored_rows; r0 += tr) {
    const int64_t r1 = std::min(stored_rows, r0 + tr);
    bf16_to_f32_array(B + r0 * stored_cols, tile, (r1 - r0) * stored_cols);
    if (trans_b)  // columns [r0, r1) of out
      gemm<float>(false, true, M, r1 - r0, K, 1.0f, A, K, tile, K, 0.0f, out + r0, N);
    else  // the K-slice [r0, r1): out += A[:, r0:r1] tile
      gemm<float>(false, false, M, N, r1 - r0, 1.0f, A + r0, K, tile, N, r0 == 0 ? 0.0f : 1.0f, out,
                  N);
  }
}

}  // namespace fusetune::kernels
