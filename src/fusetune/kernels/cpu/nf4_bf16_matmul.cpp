#include "fusetune/kernels/cpu/nf4_bf16_matmul.h"

#include <algorithm>

#include "fusetune/core/tensor.h"
#include "fusetune/kernels/cpu/bf16.h"
#include "fusetune/kernels/cpu/bf16_matmul.h"

namespace fusetune::kernels {
namespace {

bool takes_bf16_path(const float* x, int64_t n) {
  return bf16_matmul_path() == Bf16MatmulPath::OneDnn && holds_bf16_values(x, n);
}

// Calls f(r0, r1, tile) for each tile of W's rows, dequantized and rounded to bf16 (counted
// scratch: the fp32 tile it is dequantized into and its bf16 copy).
template <class F>
void for_each_bf16_tile(const NF4View& w, F&& f) {
  const int64_t tr = nf4_tile_rows(w.rows, w.cols), K = w.cols;
  Tensor tile32 = Tensor::empty({tr, K}, DType::F32);
  Tensor tile16 = Tensor::empty({tr, K}, DType::BF16);
  for (int64_t r0 = 0; r0 < w.rows; r0 += tr) {
    const int64_t r1 = std::min(w.rows, r0 + tr);
    nf4_dequantize_rows(w, r0, r1, tile32.data<float>());
    f32_to_bf16_array(tile32.data<float>(), tile16.data<uint16_t>(), (r1 - r0) * K);
    f(r0, r1, tile16.data<uint16_t>());
  }
}

}  // namespace

bool nf4_matmul_bf16(const NF4View& w, const float* x, int64_t N, float* y) {
  const int64_t O = w.rows, K = w.cols;
  if (!takes_bf16_path(x, N * K)) return false;
  Tensor xb = Tensor::empty({N, K}, DType::BF16);
  f32_to_bf16_array(x, xb.data<uint16_t>(), N * K);
  for_each_bf16_tile(w, [&](int64_t r0, int64_t r1, const uint16_t* tile) {
    // y[:, r0:r1] = x tile^T: the tile's columns of y, rows O apart.
    matmul_bf16_onednn(false, true, N, r1 - r0, K, xb.data<uint16_t>(), tile, y + r0, {.ldc = O});
  });
  return true;
}

bool nf4_matmul_backward_bf16(const NF4View& w, const float* dy, int64_t N, float* dx) {
  const int64_t O = w.rows, K = w.cols;
  if (!takes_bf16_path(dy, N * O)) return false;
  Tensor dyb = Tensor::empty({N, O}, DType::BF16);
  f32_to_bf16_array(dy, dyb.data<uint16_t>(), N * O);
  for_each_bf16_tile(w, [&](int64_t r0, int64_t r1, const uint16_t* tile) {
    // dx (+)= dy[:, r0:r1] tile: the tile's rows are a slice of the summed dimension.
    matmul_bf16_onednn(false, false, N, K, r1 - r0, dyb.data<uint16_t>() + r0, tile, dx,
                       {.lda = O, .accumulate = r0 > 0});
  });
  return true;
}

int64_t nf4_matmul_bf16_scratch_bytes(int64_t N, int64_t rows, int64_t cols, bool backward) {
  const int64_t tr = nf4_tile_rows(rows, cols);
  const int64_t pad =
      backward ? matmul_bf16_onednn_scratch_bytes(false, false, N, cols, tr,
                                                  {.lda = rows, .accumulate = true})
               : matmul_bf16_onednn_scratch_bytes(false, true, N, tr, cols, {.ldc = rows});
  return tr * cols * (4 + 2) + N * (backward ? rows : cols) * 2 + pad;
}

}  // namespace fusetune::kernels
