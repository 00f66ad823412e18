#include "fusetune/kernels/cpu/fused_linear_cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "fusetune/core/tensor.h"
#include "fusetune/kernels/cpu/bf16.h"
#include "fusetune/kernels/cpu/bf16_matmul.h"
#include "fusetune/kernels/cpu/head_gemm.h"
#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/kernels/cpu/row_softmax.h"
#include "fusetune/kernels/cpu/softcap_rows.h"
#include "fusetune/util/error.h"

namespace fusetune::kernels {
namespace {

using detail::DenseHead;
using detail::NF4Head;

// One row of soft-capped logits (Gemma 2): zi := the loss gradient w.r.t. the uncapped logits,
// (softmax(zc) - onehot(y)) * scale * (1 - (zc / cap)^2) with zc = cap tanh(zi / cap); returns
// the row's loss.
template <class T>
double softcapped_ce_row(T* zi, int64_t V, int32_t y, T cap, T scale) {
  detail::softcap_row(zi, V, cap);
  const double zy = double(zi[y]);
  const T mx = detail::row_max(zi, V);
  const double s = detail::sum_exp(zi, mx, static_cast<T*>(nullptr), V);
  const T k = T(1.0 / s) * scale;
  const T slope_y = detail::softcap_slope(zi[y], cap);
  for (int64_t j = 0; j < V; ++j)
    zi[j] = detail::vexp(zi[j] - mx) * k * detail::softcap_slope(zi[j], cap);
  zi[y] -= scale * slope_y;
  return double(mx) + std::log(s) - zy;
}

// One row of logits: zi := the loss gradient (softmax(zi) - onehot(y)) * scale; returns the
// row's loss.
template <class T>
double ce_row(T* zi, int64_t V, int32_t y, T scale) {
  const double zy = double(zi[y]);
  const T mx = detail::row_max(zi, V);
  const double s = detail::sum_exp(zi, mx, zi, V);  // zi := exp(zi - mx), as log_softmax does
  const T k = T(1.0 / s) * scale;
#pragma omp simd
  for (int64_t j = 0; j < V; ++j) zi[j] *= k;
  zi[y] -= scale;
  return double(mx) + std::log(s) - zy;
}

template <class T, class Head>
double fused_ce(const Head& head, const T* h, const int32_t* labels, T scale, int64_t N, int64_t D,
                int64_t V, int64_t chunk_rows, T* dh, T* dW, double softcap) {
  const int64_t C = std::max<int64_t>(1, std::min(chunk_rows, N));
  // Scratch: logits/grad of one chunk, its gathered hidden rows and their gradient. Counted
  // memory, so the planner's and the run's peak both see it.
  Tensor z_buf = Tensor::empty({C, V}, dtype_of<T>());
  Tensor hc_buf = Tensor::empty({C, D}, dtype_of<T>());
  Tensor dhc_buf = Tensor::empty({C, D}, dtype_of<T>());
  T* z = z_buf.data<T>();
  T* hc = hc_buf.data<T>();
  T* dhc = dhc_buf.data<T>();
  std::vector<int64_t> rows;
  std::vector<double> row_loss(size_t(C), 0.0);
  rows.reserve(size_t(C));

  std::memset(dh, 0, sizeof(T) * size_t(N * D));
  bool dW_written = false;  // the first chunk's GEMM writes dW (beta 0): no pass to zero it
  double total = 0.0;

  for (int64_t r0 = 0; r0 < N; r0 += C) {
    const int64_t c =
        detail::gather_labelled_rows(h, labels, r0, std::min(N, r0 + C), D, V, rows, hc);
    if (c == 0) continue;

    head.logits(hc, c, z);

#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < c; ++i) {
      T* zi = z + i * V;
      const int32_t y = labels[rows[i]];
      row_loss[size_t(i)] =
          softcap > 0 ? softcapped_ce_row(zi, V, y, T(softcap), scale) : ce_row(zi, V, y, scale);
      if constexpr (detail::kBf16GradHead<Head>) head.round_row(zi, V);
    }
    for (int64_t i = 0; i < c; ++i) total += row_loss[size_t(i)];

    head.grad_h(z, c, dhc);
    for (int64_t i = 0; i < c; ++i)
      std::memcpy(dh + rows[i] * D, dhc + i * D, sizeof(T) * size_t(D));
    if constexpr (detail::kBf16GradHead<Head>) {
      if (dW) head.grad_w(z, c, dW, dW_written);
    } else {
      if (dW) detail::head_grad_w(z, hc, c, D, V, dW, dW_written);
    }
    dW_written = true;
  }
  if (dW && !dW_written) std::memset(dW, 0, sizeof(T) * size_t(V * D));  // no labelled row
  return total * double(scale);
}

}  // namespace

int64_t fused_ce_chunk_rows(int64_t N, int64_t V, int64_t elem_bytes, int64_t budget_bytes) {
  int64_t rows = budget_bytes / std::max<int64_t>(1, V * elem_bytes);
  rows = std::max<int64_t>(16, rows / 16 * 16);
  return std::min(rows, std::max<int64_t>(1, N));
}

int64_t fused_ce_scratch_bytes(int64_t chunk_rows, int64_t D, int64_t V, int64_t elem_bytes,
                               bool tiled, Bf16HeadProducts bf16) {
  const int64_t bytes = (chunk_rows * V + 2 * chunk_rows * D) * elem_bytes;
  const int64_t tile = tiled ? nf4_tile_rows(V, D) * D * elem_bytes : 0;
  return bytes + std::max(tile, bf16_head_products_scratch_bytes(bf16, chunk_rows, D, V));
}

template <class T>
double fused_linear_cross_entropy(const T* h, const T* W, const int32_t* labels, T scale, int64_t N,
                                  int64_t D, int64_t V, int64_t chunk_rows, T* dh, T* dW,
                                  double softcap) {
  return fused_ce<T>(DenseHead<T>{W, D, V}, h, labels, scale, N, D, V, chunk_rows, dh, dW, softcap);
}

template <class T>
double fused_nf4_linear_cross_entropy(const T* h, const NF4View& W, const int32_t* labels, T scale,
                                      int64_t N, int64_t chunk_rows, T* dh, double softcap) {
  const int64_t V = W.rows, D = W.cols, tr = nf4_tile_rows(V, D);
  Tensor tile_buf = Tensor::empty({tr, D}, dtype_of<T>());  // counted scratch
  if constexpr (std::is_same_v<T, float>) {
    if (bf16_matmul_path() == Bf16MatmulPath::OneDnn && holds_bf16_values(h, N * D)) {
      const int64_t C = std::max<int64_t>(1, std::min(chunk_rows, N));
      Tensor tile16 = Tensor::empty({tr, D}, DType::BF16),
             hc16 = Tensor::empty({C, D}, DType::BF16);
      return fused_ce<float>(detail::OneDnnNF4Head{{W},
                                                   D,
                                                   V,
                                                   tr,
                                                   tile_buf.data<float>(),
                                                   tile16.data<uint16_t>(),
                                                   hc16.data<uint16_t>()},
                             h, labels, scale, N, D, V, chunk_rows, dh, nullptr, softcap);
    }
  }
  return fused_ce<T>(NF4Head<T>{{W}, D, V, tr, tile_buf.data<T>()}, h, labels, scale, N, D, V,
                     chunk_rows, dh, static_cast<T*>(nullptr), softcap);
}

double fused_bf16_linear_cross_entropy(const float* h, const uint16_t* W, const int32_t* labels,
                                       float scale, int64_t N, int64_t D, int64_t V,
                                       int64_t chunk_rows, float* dh, float* dW, double softcap) {
  if (bf16_matmul_path() == Bf16MatmulPath::OneDnn && holds_bf16_values(h, N * D)) {
    const int64_t C = std::max<int64_t>(1, std::min(chunk_rows, N));
    Tensor hc_bf16 = Tensor::empty({C, D}, DType::BF16);  // counted scratch
    return fused_ce<float>(detail::OneDnnBf16Head{W, D, V, hc_bf16.data<uint16_t>()}, h, labels,
                           scale, N, D, V, chunk_rows, dh, dW, softcap);
  }
  const int64_t tr = bf16_tile_rows(V, D);
  Tensor tile_buf = Tensor::empty({tr, D}, DType::F32);  // counted scratch
  return fused_ce<float>(detail::BF16Head<float>{{W, D}, D, V, tr, tile_buf.data<float>()}, h,
                         labels, scale, N, D, V, chunk_rows, dh, dW, softcap);
}

template <class T>
double fused_fake_quant_linear_cross_entropy(const FakeQuantSpec& spec, const T* h, const T* W,
                                             const int32_t* labels, T scale, int64_t N, int64_t D,
                                             int64_t V, int64_t chunk_rows, T* dh, T* dW,
                                             double softcap) {
  const int64_t tr = fake_quant_tile_rows(V, D);
  Tensor tile_buf = Tensor::empty({tr, D}, dtype_of<T>());  // counted scratch
  const FakeQuantWeight<T> weight(spec, W, V, D);
  using Head = detail::TiledHead<T, detail::FakeQuantRows<T>>;
  return fused_ce<T>(Head{{weight}, D, V, tr, tile_buf.data<T>()}, h, labels, scale, N, D, V,
                     chunk_rows, dh, dW, softcap);
}

double fused_fake_quant_bf16_linear_cross_entropy(const FakeQuantSpec& spec, const float* h,
                                                  const uint16_t* W, const int32_t* labels,
                                                  float scale, int64_t N, int64_t D, int64_t V,
                                                  int64_t chunk_rows, float* dh, float* dW,
                                                  double softcap) {
  const int64_t tr = fake_quant_tile_rows(V, D);
  Tensor tile_buf = Tensor::empty({tr, D}, DType::F32);  // counted scratch
  const FakeQuantWeight<uint16_t> weight(spec, W, V, D);
  using Rows = detail::FakeQuantRows<uint16_t>;
  if (bf16_matmul_path() == Bf16MatmulPath::OneDnn && holds_bf16_values(h, N * D)) {
    const int64_t C = std::max<int64_t>(1, std::min(chunk_rows, N));
    Tensor tile16 = Tensor::empty({tr, D}, DType::BF16), hc16 = Tensor::empty({C, D}, DType::BF16);
    return fused_ce<float>(detail::OneDnnTiledHead<Rows>{{weight},
                                                         D,
                                                         V,
                                                         tr,
                                                         tile_buf.data<float>(),
                                                         tile16.data<uint16_t>(),
                                                         hc16.data<uint16_t>()},
                           h, labels, scale, N, D, V, chunk_rows, dh, dW, softcap);
  }
  using Head = detail::TiledHead<float, Rows>;
  return fused_ce<float>(Head{{weight}, D, V, tr, tile_buf.data<float>()}, h, labels, scale, N, D,
                         V, chunk_rows, dh, dW, softcap);
}

#define FT_FUSED_CE(T)                                                                           \
  template double fused_linear_cross_entropy<T>(const T*, const T*, const int32_t*, T, int64_t,  \
                                                int64_t, int64_t, int64_t, T*, T*, double);      \
  template double fused_nf4_linear_cross_entropy<T>(const T*, const NF4View&, const int32_t*, T, \
                                                    int64_t, int64_t, T*, double);               \
  template double fused_fake_quant_linear_cross_entropy<T>(                                      \
      const FakeQuantSpec&, const T*, const T*, const int32_t*, T, int64_t, int64_t, int64_t,    \
      int64_t, T*, T*, double);
FT_FUSED_CE(float)
FT_FUSED_CE(double)
#undef FT_FUSED_CE

}  // namespace fusetune::kernels
