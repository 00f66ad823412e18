#include "fusetune/kernels/cpu/head_gemm.h"

#include <algorithm>
#include <cstring>

#include "fusetune/kernels/cpu/bf16_head_products.h"
#include "fusetune/kernels/cpu/bf16_matmul.h"

namespace fusetune::kernels::detail {

void OneDnnBf16Head::logits(const float* hc, int64_t c, float* z) const {
  f32_to_bf16_array(hc, hc_bf16, c * D);
  matmul_bf16_onednn(false, true, c, V, D, hc_bf16, W, z, Bf16MatmulLayout{});
}

void OneDnnBf16Head::grad_h(const float* z, int64_t c, float* dhc) const {
  matmul_bf16_onednn(false, false, c, D, V, bf16_logit_grads(z), W, dhc, {.lda = 2 * V});
}

void OneDnnBf16Head::grad_w(const float* z, int64_t c, float* dW, bool accumulate) const {
  bf16_head_grad_w(z, hc_bf16, c, D, V, dW, accumulate);
}

int64_t OneDnnBf16Head::scratch_bytes(int64_t C, int64_t D, int64_t V) {
  const int64_t pad = std::max(
      {matmul_bf16_onednn_scratch_bytes(false, true, C, V, D, Bf16MatmulLayout{}),
       matmul_bf16_onednn_scratch_bytes(false, false, C, D, V, {.lda = 2 * V}),
       matmul_bf16_onednn_scratch_bytes(true, false, V, D, C, {.lda = 2 * V, .accumulate = true})});
  return C * D * 2 + pad;
}

void bf16_head_grad_w(const float* z, const uint16_t* hc_bf16, int64_t c, int64_t D, int64_t V,
                      float* dW, bool accumulate) {
  matmul_bf16_onednn(true, false, V, D, c, bf16_logit_grads(z), hc_bf16, dW,
                     {.lda = 2 * V, .accumulate = accumulate});
}

int64_t onednn_tiled_head_scratch_bytes(int64_t C, int64_t D, int64_t V, int64_t tile_rows) {
  const int64_t tr = tile_rows;
  const int64_t pad = std::max(
      {matmul_bf16_onednn_scratch_bytes(false, true, C, tr, D, {.ldc = V}),
       matmul_bf16_onednn_scratch_bytes(false, false, C, D, tr, {.lda = 2 * V, .accumulate = true}),
       matmul_bf16_onednn_scratch_bytes(true, false, V, D, C, {.lda = 2 * V, .accumulate = true})});
  return tr * D * (4 + 2) + C * D * 2 + pad;
}

}  // namespace fusetune::kernels::detail

namespace fusetune::kernels {

int64_t bf16_head_products_scratch_bytes(Bf16HeadProducts kind, int64_t C, int64_t D, int64_t V) {
  switch (kind) {
    case Bf16HeadProducts::None:
      return 0;
    case Bf16HeadProducts::Bf16Weight:
      return detail::OneDnnBf16Head::scratch_bytes(C, D, V);
    case Bf16HeadProducts::NF4Weight:
      return detail::onednn_tiled_head_scratch_bytes(C, D, V, nf4_tile_rows(V, D));
    case Bf16HeadProducts::FakeQuantWeight:  // or the plain bf16 head while fake quantization waits
      return std::max(detail::onednn_tiled_head_scratch_bytes(C, D, V, fake_quant_tile_rows(V, D)),
                      detail::OneDnnBf16Head::scratch_bytes(C, D, V));
  }
  return 0;
}

}  // namespace fusetune::kernels

namespace fusetune::kernels::detail {

void round_row_to_bf16_in_place(float* x, int64_t n) {
  constexpr int64_t kBlock = 256;
  uint16_t block[kBlock];
  char* out = reinterpret_cast<char*>(x);
  for (int64_t i = 0; i < n; i += kBlock) {
    const int64_t m = std::min(kBlock, n - i);
    f32_to_bf16_array(x + i, block, m);
    std::memcpy(out + 2 * i, block, size_t(2 * m));
  }
}

}  // namespace fusetune::kernels::detail
