#include "fusetune/kernels/cpu/decode_gemv.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "fusetune/core/dtype.h"
#include "fusetune/core/tensor.h"
#include "fusetune/kernels/cpu/bf16.h"
#include "fusetune/kernels/cpu/decode_gemv_rows.h"
#include "fusetune/kernels/cpu/parallel.h"
#include "fusetune/util/error.h"

namespace fusetune::kernels {

namespace {

constexpr int64_t kGemvRowBlock = 4;  // weight rows per block (and rows of x at a time)

// Products of every row of x with NB weight rows (from n0) into out [M, NB]: x in blocks of
// 4, 2 and 1 rows.
template <int NB, class Rows>
void gemv_rows_dot(const float* x, int64_t M, int64_t K, const Rows& w, int64_t n0, float* out) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) gemv_block_dot<4, NB>(x + m * K, K, w, n0, out + m * NB);
  if (m + 2 <= M) gemv_block_dot<2, NB>(x + m * K, K, w, n0, out + m * NB), m += 2;
  if (m < M) gemv_block_dot<1, NB>(x + m * K, K, w, n0, out + m * NB);
}

// y [M, N] = x [M, K] W^T for a weight of N rows read through `w`; each thread takes blocks
// of 4 weight rows, so every output is one thread's sum.
template <class Rows>
void decode_gemv(int64_t M, int64_t N, int64_t K, const float* x, const Rows& w, void* y,
                 bool y_bf16) {
  FT_CHECK(M >= 0 && M <= kDecodeGemvMaxRows, "decode_gemv: M must be <= kDecodeGemvMaxRows");
  const int64_t blocks = (N + kGemvRowBlock - 1) / kGemvRowBlock;
#pragma omp parallel for schedule(static) if (N * K >= detail::kParallelMin)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t n0 = b * kGemvRowBlock, nb = std::min<int64_t>(kGemvRowBlock, N - n0);
    float acc[kDecodeGemvMaxRows * kGemvRowBlock];  // [M, nb]
    if (nb == kGemvRowBlock)
      gemv_rows_dot<kGemvRowBlock>(x, M, K, w, n0, acc);
    else
      for (int64_t j = 0; j < nb; ++j) {
        float one[kDecodeGemvMaxRows];
        gemv_rows_dot<1>(x, M, K, w, n0 + j, one);
        for (int64_t m = 0; m < M; ++m) acc[m * nb + j] = one[m];
      }
    store_gemv_block(acc, nb, M, N, n0, nb, y, y_bf16);
  }
}

}  // namespace

void decode_gemv_bf16_weight(int64_t M, int64_t N, int64_t K, const void* x, bool x_bf16,
                             const uint16_t* w, void* y, bool y_bf16) {
  if (M == 0 || N == 0) return;
  // x is small (M rows): widen it once, whole (a counted scratch tensor).
  Tensor x_wide;
  const float* xs = static_cast<const float*>(x);
  if (x_bf16) {
    x_wide = Tensor::empty({M, K}, DType::F32);
    bf16_to_f32_array(static_cast<const uint16_t*>(x), x_wide.data<float>(), M * K);
    xs = x_wide.data<float>();
  }
  decode_gemv(M, N, K, xs, Bf16Rows{w, K}, y, y_bf16);
}

bool decode_gemv_nf4_weight(int64_t M, const NF4View& w, const float* x, float* y) {
  if (w.cols % kGemvLanes != 0 || M > kDecodeGemvMaxRows) return false;
  if (M > 0 && w.rows > 0) decode_gemv(M, w.rows, w.cols, x, Nf4Rows{.w = w}, y, false);
  return true;
}

}  // namespace fusetune::kernels
