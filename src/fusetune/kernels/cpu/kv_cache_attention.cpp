#include "fusetune/kernels/cpu/kv_cache_attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "fusetune/kernels/cpu/parallel.h"
#include "fusetune/util/error.h"

namespace fusetune::kernels {
namespace {

// y = A x (trans false) or A^T x (trans true) for a row-major A [M, N] with row stride lda.
inline void gemv(bool trans, int64_t M, int64_t N, const float* A, int64_t lda, const float* x,
                 float* y) {
  cblas_sgemv(CblasRowMajor, trans ? CblasTrans : CblasNoTrans, int(M), int(N), 1.0f, A, int(lda),
              x, 1, 0.0f, y, 1);
}
inline void gemv(bool trans, int64_t M, int64_t N, const double* A, int64_t lda, const double* x,
                 double* y) {
  cblas_dgemv(CblasRowMajor, trans ? CblasTrans : CblasNoTrans, int(M), int(N), 1.0, A, int(lda), x,
              1, 0.0, y, 1);
}

}  // namespace

template <class T>
void kv_cache_attention(const T* q, const T* k, const T* v, T* k_cache, T* v_cache,
                        int64_t cache_pos, const int32_t* cache_start, T* o, const KVCacheDims& d,
                        double scale) {
  const int64_t B = d.batch, Tq = d.queries, H = d.heads, KV = d.kv_heads, hd = d.head_dim,
                S = d.cache_len;
  FT_CHECK(KV >= 1 && H % KV == 0 && hd >= 1, "kv_cache_attention: H must be a multiple of KV");
  FT_CHECK(cache_pos >= 0 && cache_pos + Tq <= S,
           "kv_cache_attention: the cache holds " + std::to_string(S) + " positions; writing " +
               std::to_string(Tq) + " at " + std::to_string(cache_pos) + " overflows it");
  for (int64_t b = 0; b < B; ++b)
    FT_CHECK(cache_start[b] >= 0 && cache_start[b] <= S,
             "kv_cache_attention: cache_start[" + std::to_string(b) +
                 "] = " + std::to_string(cache_start[b]) + " is outside the cache");
  const int64_t row = KV * hd;  // elements per cache slot
  for (int64_t b = 0; b < B; ++b) {
    std::memcpy(k_cache + (b * S + cache_pos) * row, k + b * Tq * row, sizeof(T) * Tq * row);
    std::memcpy(v_cache + (b * S + cache_pos) * row, v + b * Tq * row, sizeof(T) * Tq * row);
  }
  const int64_t G = H / KV, items = B * Tq * H;
  const bool par = items * (cache_pos + Tq) * hd >= detail::kParallelMin;
#pragma omp parallel if (par)
  {
    std::vector<T> p(static_cast<size_t>(S));
#pragma omp for schedule(static)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t h = it % H, t = (it / H) % Tq, b = it / (H * Tq);
      int64_t j0 = cache_start[b];
      const int64_t j1 = cache_pos + t + 1;  // visible slots [j0, j1)
      if (d.window > 0) j0 = std::max(j0, j1 - d.window);
      T* out = o + it * hd;
      if (j1 <= j0) {
        std::fill(out, out + hd, T(0));
        continue;
      }
      const int64_t n = j1 - j0;
      const T* kc = k_cache + (b * S + j0) * row + (h / G) * hd;
      const T* vc = v_cache + (b * S + j0) * row + (h / G) * hd;
      gemv(false, n, hd, kc, row, q + it * hd, p.data());
      T step = T(scale);  // the scale, unless the cap below has applied it
      if (d.softcap > 0) {
        const T cap = T(d.softcap), inv = T(1) / cap;
        for (int64_t j = 0; j < n; ++j) p[j] = std::tanh(T(scale) * p[j] * inv) * cap;
        step = T(1);
      }
      T mx = p[0];
      for (int64_t j = 1; j < n; ++j) mx = std::max(mx, p[j]);
      T sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        p[j] = std::exp(step * (p[j] - mx));
        sum += p[j];
      }
      const T inv = T(1) / sum;
      for (int64_t j = 0; j < n; ++j) p[j] *= inv;
      gemv(true, n, hd, vc, row, p.data(), out);
    }
  }
}

template void kv_cache_attention<float>(const float*, const float*, const float*, float*, float*,
                                        int64_t, const int32_t*, float*, const KVCacheDims&,
                                        double);
template void kv_cache_attention<double>(const double*, const double*, const double*, double*,
                                         double*, int64_t, const int32_t*, double*,
                                         const KVCacheDims&, double);

}  // namespace fusetune::kernels
