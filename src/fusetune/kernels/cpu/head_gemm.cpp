#include "fusetune/kernels/cpu/head_gemm.h"

#include <algorithm>
#include <cstring>

#include "fusetune/kernels/cpu/bf16_head_products.h"
#include "fusetune/kernels/cpu/bf16_matmul.h"
#include "fusetune/util/error.h"

namespace fusetune::kernels::detail {

namespace {
const uint16_t* bf16_grad_rows(const float* z) { return reinterpret_cast<const uint16_t*>(z); }
}  // namespace

void OneDnnBf16Head::logits(const float* hc, int64_t c, float* z) const {
  f32_to_bf16_array(hc, hc_bf16, c * D);
  matmul_bf16_onednn(false, true, c, V, D, hc_bf16, W, z, Bf16MatmulLayout{});
}

void OneDnnBf16Head::grad_h(const float* z, int64_t c, float* dhc) const {
  matmul_bf16_onednn(false, false, c, D, V, bf16_grad_rows(z), W, dhc, {.lda = 2 * V});
}

void OneDnnBf16Head::grad_w(const float* z, int64_t c, float* dW, bool accumulate) const {
  matmul_bf16_onednn(true, false, V, D, c, bf16_grad_rows(z), hc_bf16, dW,
                     {.lda = 2 * V, .accumulate = accumulate});
}

int64_t OneDnnBf16Head::scratch_bytes(int64_t C, int64_t D, int64_t V) {
  const int64_t pad = std::max(
      {matmul_bf16_onednn_scratch_bytes(false, true, C, V, D, Bf16MatmulLayout{}),
       matmul_bf16_onednn_scratch_bytes(false, false, C, D, V, {.lda = 2 * V}),
       matmul_bf16_onednn_scratch_bytes(true, false, V, D, C, {.lda = 2 * V, .accumulate = true})});
  return C * D * 2 + pad;
}

namespace {
// Rows [v0, v1) of an NF4 head, dequantized into tile32 and rounded into tile16.
void bf16_nf4_tile(const NF4View& W, int64_t v0, int64_t v1, float* tile32, uint16_t* tile16) {
  nf4_dequantize_rows(W, v0, v1, tile32);
  f32_to_bf16_array(tile32, tile16, (v1 - v0) * W.cols);
}
}  // namespace

void OneDnnNF4Head::logits(const float* hc, int64_t c, float* z) const {
  f32_to_bf16_array(hc, hc_bf16, c * D);
  for (int64_t v0 = 0; v0 < V; v0 += tile_rows) {
    const int64_t v1 = std::min(V, v0 + tile_rows);
    bf16_nf4_tile(W, v0, v1, tile32, tile16);
    matmul_bf16_onednn(false, true, c, v1 - v0, D, hc_bf16, tile16, z + v0, {.ldc = V});
  }
}

void OneDnnNF4Head::grad_h(const float* z, int64_t c, float* dhc) const {
  for (int64_t v0 = 0; v0 < V; v0 += tile_rows) {
    const int64_t v1 = std::min(V, v0 + tile_rows);
    bf16_nf4_tile(W, v0, v1, tile32, tile16);
    matmul_bf16_onednn(false, false, c, D, v1 - v0, bf16_grad_rows(z) + v0, tile16, dhc,
                       {.lda = 2 * V, .accumulate = v0 > 0});
  }
}

void OneDnnNF4Head::grad_w(const float*, int64_t, float*, bool) const {
  throw Error("an NF4 head is frozen: it has no weight gradient");
}

int64_t OneDnnNF4Head::scratch_bytes(int64_t C, int64_t D, int64_t V) {
  const int64_t tr = nf4_tile_rows(V, D);
  const int64_t pad = std::max(
      matmul_bf16_onednn_scratch_bytes(false, true, C, tr, D, {.ldc = V}),
      matmul_bf16_onednn_scratch_bytes(false, false, C, D, tr, {.lda = 2 * V, .accumulate = true}));
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
      return detail::OneDnnNF4Head::scratch_bytes(C, D, V);
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
