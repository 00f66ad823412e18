#include "fusetune/kernels/cpu/fused_linear_log_probs.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "fusetune/core/tensor.h"
#include "fusetune/kernels/cpu/bf16_matmul.h"
#include "fusetune/kernels/cpu/head_gemm.h"
#include "fusetune/kernels/cpu/row_softmax.h"
#include "fusetune/kernels/cpu/softcap_rows.h"
#include "fusetune/util/error.h"

namespace fusetune::kernels {
namespace {

// Calls f(head) with the dense, NF4 or bf16 product helper (tiles, and the bf16 rows of a
// chunk of C rows of h, are counted scratch). A bf16 or NF4 head runs on the CPU's bf16 dot
// products where they are chosen and h [N, D] holds bf16 values (fused_linear_cross_entropy.h).
template <class T, class F>
void with_head(const LogProbHead<T>& head, const T* h, int64_t N, int64_t C, F&& f) {
  if (head.nf4 == nullptr && head.bf16 == nullptr)
    return f(detail::DenseHead<T>{head.W, head.D, head.V});
  if constexpr (std::is_same_v<T, float>) {
    if (bf16_matmul_path() == Bf16MatmulPath::OneDnn && holds_bf16_values(h, N * head.D)) {
      Tensor hc_bf16 = Tensor::empty({C, head.D}, DType::BF16);
      if (head.bf16)
        return f(detail::OneDnnBf16Head{head.bf16, head.D, head.V, hc_bf16.data<uint16_t>()});
      const int64_t tr = nf4_tile_rows(head.V, head.D);
      Tensor tile32 = Tensor::empty({tr, head.D}, DType::F32);
      Tensor tile16 = Tensor::empty({tr, head.D}, DType::BF16);
      return f(detail::OneDnnNF4Head{{*head.nf4},
                                     head.D,
                                     head.V,
                                     tr,
                                     tile32.data<float>(),
                                     tile16.data<uint16_t>(),
                                     hc_bf16.data<uint16_t>()});
    }
  }
  const int64_t tr = nf4_tile_rows(head.V, head.D);
  Tensor tile = Tensor::empty({tr, head.D}, dtype_of<T>());
  if (head.nf4)
    f(detail::NF4Head<T>{{*head.nf4}, head.D, head.V, tr, tile.data<T>()});
  else
    f(detail::BF16Head<T>{{head.bf16, head.D}, head.D, head.V, tr, tile.data<T>()});
}

// The kept logits are one chunk of a dense, uncapped head (the pass only asks for them then).
template <class T>
void check_kept_logits(const T* logits, const LogProbHead<T>& head, int64_t N, int64_t C) {
  FT_CHECK(!logits || (head.W && head.softcap == 0 && N <= C),
           "fused_linear_log_probs: kept logits need a dense, uncapped head and one chunk (" +
               std::to_string(N) + " rows, chunks of " + std::to_string(C) + ")");
}

}  // namespace

template <class T>
void fused_linear_log_probs(const T* h, const int32_t* labels, const LogProbHead<T>& head,
                            int64_t N, int64_t chunk_rows, T* logp, T* lse, T* zsum, T* expect,
                            T* logits) {
  const int64_t D = head.D, V = head.V;
  const int64_t C = std::max<int64_t>(1, std::min(chunk_rows, N));
  check_kept_logits(logits, head, N, C);
  Tensor z_buf = logits ? Tensor() : Tensor::empty({C, V}, dtype_of<T>());
  Tensor hc_buf = Tensor::empty({C, D}, dtype_of<T>());
  Tensor ec_buf = expect ? Tensor::empty({C, D}, dtype_of<T>()) : Tensor();
  T* z = logits ? logits : z_buf.data<T>();
  T* hc = hc_buf.data<T>();
  std::fill(logp, logp + N, T(0));
  std::fill(lse, lse + N, T(0));
  std::fill(zsum, zsum + N, T(0));
  if (expect) std::memset(expect, 0, sizeof(T) * size_t(N * D));
  std::vector<int64_t> rows;
  rows.reserve(size_t(C));
  with_head(head, h, N, C, [&](const auto& W) {
    constexpr bool bf16_rows = detail::kBf16GradHead<std::decay_t<decltype(W)>>;
    for (int64_t r0 = 0; r0 < N; r0 += C) {
      const int64_t c =
          detail::gather_labelled_rows(h, labels, r0, std::min(N, r0 + C), D, V, rows, hc);
      if (c == 0) continue;
      W.logits(hc, c, z);
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < c; ++i) {
        const T* zi = z + i * V;
        const int64_t r = rows[size_t(i)];
        if (head.softcap > 0) detail::softcap_row(z + i * V, V, T(head.softcap));
        const T mx = detail::row_max(zi, V);
        const double l =
            double(mx) + std::log(detail::sum_exp(zi, mx, static_cast<T*>(nullptr), V));
        lse[r] = T(l);
        logp[r] = T(double(zi[labels[r]]) - l);
        zsum[r] = T(detail::row_sum(zi, V));
        if (expect && head.softcap > 0) {
          // Through the cap, dh = dlogp (s_y W[y] - sum_v p_v s_v W_v) with s the cap's slope:
          // the frozen backward's dlogp (W[y] - e) when e = sum_v p_v s_v W_v + (1 - s_y) W[y].
          const T cap = T(head.softcap), lt = T(l);
          const int32_t y = labels[r];
          const T slope_y = detail::softcap_slope(zi[y], cap);
          for (int64_t j = 0; j < V; ++j)
            z[i * V + j] = detail::vexp(zi[j] - lt) * detail::softcap_slope(zi[j], cap);
          z[i * V + y] += T(1) - slope_y;
        } else if (expect) {  // the row's softmax, in place, for E_p[W] below
          const T lt = T(l);
#pragma omp simd
          for (int64_t j = 0; j < V; ++j) z[i * V + j] = detail::vexp(zi[j] - lt);
        }
        if constexpr (bf16_rows)
          if (expect) W.round_row(z + i * V, V);
      }
      if (expect) {
        T* ec = ec_buf.data<T>();
        W.grad_h(z, c, ec);  // ec [c, D] = softmax(z) W
        for (int64_t i = 0; i < c; ++i)
          std::memcpy(expect + rows[i] * D, ec + i * D, sizeof(T) * size_t(D));
      }
    }
  });
}

template <class T>
void fused_linear_log_probs_backward_frozen(const int32_t* labels, const T* expect, const T* dlogp,
                                            const LogProbHead<T>& head, int64_t N, T* dh) {
  const int64_t D = head.D, V = head.V;
  std::memset(dh, 0, sizeof(T) * size_t(N * D));
  Tensor row_buf = head.W ? Tensor() : Tensor::empty({1, D}, dtype_of<T>());
  for (int64_t r = 0; r < N; ++r) {
    const int32_t y = labels[r];
    if (y == -100) continue;
    FT_CHECK(y >= 0 && y < V, "label " + std::to_string(y) + " at token " + std::to_string(r) +
                                  " is outside the vocabulary [0, " + std::to_string(V) + ")");
    const T* wy = head.W ? head.W + int64_t(y) * D : row_buf.data<T>();
    if (head.nf4) nf4_dequantize_rows(*head.nf4, y, y + 1, row_buf.data<T>());
    if (head.bf16) detail::BF16Rows{head.bf16, D}(y, y + 1, row_buf.data<T>());
    const T g = dlogp[r];
    const T* e = expect + r * D;
    T* d = dh + r * D;
#pragma omp simd
    for (int64_t k = 0; k < D; ++k) d[k] = g * (wy[k] - e[k]);
  }
}

template <class T>
void fused_linear_log_probs_backward(const T* h, const int32_t* labels, const T* lse,
                                     const T* dlogp, const LogProbHead<T>& head, int64_t N,
                                     int64_t chunk_rows, T* dh, T* dW, T* logits) {
  const int64_t D = head.D, V = head.V;
  const int64_t C = std::max<int64_t>(1, std::min(chunk_rows, N));
  check_kept_logits(logits, head, N, C);
  Tensor z_buf = logits ? Tensor() : Tensor::empty({C, V}, dtype_of<T>());
  Tensor hc_buf = Tensor::empty({C, D}, dtype_of<T>());
  Tensor dhc_buf = Tensor::empty({C, D}, dtype_of<T>());
  T* z = logits ? logits : z_buf.data<T>();
  T* hc = hc_buf.data<T>();
  T* dhc = dhc_buf.data<T>();
  std::memset(dh, 0, sizeof(T) * size_t(N * D));
  if (dW) std::memset(dW, 0, sizeof(T) * size_t(V * D));
  std::vector<int64_t> rows;
  rows.reserve(size_t(C));
  with_head(head, h, N, C, [&](const auto& W) {
    constexpr bool bf16_rows = detail::kBf16GradHead<std::decay_t<decltype(W)>>;
    for (int64_t r0 = 0; r0 < N; r0 += C) {
      const int64_t c =
          detail::gather_labelled_rows(h, labels, r0, std::min(N, r0 + C), D, V, rows, hc);
      if (c == 0) continue;
      // The forward's logits of the same gathered rows (one chunk) are these bits.
      if (!logits) W.logits(hc, c, z);
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < c; ++i) {
        T* zi = z + i * V;
        const int64_t r = rows[size_t(i)];
        const T g = dlogp[r], l = lse[r];
        if (head.softcap > 0) {  // the same through the cap: times its slope
          const T cap = T(head.softcap);
          detail::softcap_row(zi, V, cap);
          const T slope_y = detail::softcap_slope(zi[labels[r]], cap);
          for (int64_t j = 0; j < V; ++j)
            zi[j] = -g * detail::vexp(zi[j] - l) * detail::softcap_slope(zi[j], cap);
          zi[labels[r]] += g * slope_y;
        } else {
          // dz = -g softmax(z) + g onehot(y): the VJP of log_softmax then the label gather.
#pragma omp simd
          for (int64_t j = 0; j < V; ++j) zi[j] = -g * detail::vexp(zi[j] - l);
          zi[labels[r]] += g;
        }
        if constexpr (bf16_rows) W.round_row(zi, V);
      }
      W.grad_h(z, c, dhc);
      for (int64_t i = 0; i < c; ++i)
        std::memcpy(dh + rows[i] * D, dhc + i * D, sizeof(T) * size_t(D));
      if constexpr (bf16_rows) {
        if (dW) W.grad_w(z, c, dW, true);
      } else {
        if (dW) detail::head_grad_w(z, hc, c, D, V, dW, true);
      }
    }
  });
}

int64_t fused_log_probs_scratch_bytes(int64_t chunk_rows, int64_t D, int64_t V, int64_t elem_bytes,
                                      bool tiled, bool backward, bool frozen, Bf16HeadProducts bf16,
                                      bool kept_logits) {
  if (backward && frozen) return tiled ? D * elem_bytes : 0;  // one widened label row
  // The logits block (unless kept) and the gathered rows; the trainable backward's dh rows, or
  // the frozen forward's E_p[W] rows.
  int64_t elems = (kept_logits ? 0 : chunk_rows * V) + chunk_rows * D +
                  ((backward || frozen) ? chunk_rows * D : 0);
  const int64_t tile = tiled ? nf4_tile_rows(V, D) * D * elem_bytes : 0;
  return elems * elem_bytes +
         std::max(tile, bf16_head_products_scratch_bytes(bf16, chunk_rows, D, V));
}

#define FT_FUSED_LOGP(T)                                                                         \
  template void fused_linear_log_probs<T>(const T*, const int32_t*, const LogProbHead<T>&,       \
                                          int64_t, int64_t, T*, T*, T*, T*, T*);                 \
  template void fused_linear_log_probs_backward_frozen<T>(const int32_t*, const T*, const T*,    \
                                                          const LogProbHead<T>&, int64_t, T*);   \
  template void fused_linear_log_probs_backward<T>(const T*, const int32_t*, const T*, const T*, \
                                                   const LogProbHead<T>&, int64_t, int64_t, T*,  \
                                                   T*, T*);
FT_FUSED_LOGP(float)
FT_FUSED_LOGP(double)
#undef FT_FUSED_LOGP

}  // namespace fusetune::kernels
