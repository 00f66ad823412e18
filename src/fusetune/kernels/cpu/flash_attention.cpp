// Tiled causal attention with an online softmax, forward and backward (flash_attention.h).
// Each tile is a few small GEMMs on strided rows of q/k/v (single-threaded OpenBLAS calls
// inside our OpenMP region) and one vectorized pass of exp over the tile.
#include "fusetune/kernels/cpu/flash_attention.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "fusetune/core/tensor.h"
#include "fusetune/kernels/cpu/row_softmax.h"
#include "fusetune/kernels/cpu/vexp.h"
#include "fusetune/util/error.h"

namespace fusetune::kernels {
namespace {

constexpr int64_t kBq = kFlashBlockQ, kBk = kFlashBlockK;

// Row-major BLAS GEMM without the argument checks of kernels::gemm (sizes are ours, and this
// runs thousands of times per call).
inline void mm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
               int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M),
              int(N), int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}
inline void mm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
               int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M),
              int(N), int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}

void check_dims(const AttentionDims& d, const char* who) {
  FT_CHECK(d.batch >= 0 && d.seq >= 0 && d.heads >= 1 && d.kv_heads >= 1 && d.head_dim >= 1 &&
               d.heads % d.kv_heads == 0,
           std::string(who) + ": bad shape B=" + std::to_string(d.batch) +
               " T=" + std::to_string(d.seq) + " H=" + std::to_string(d.heads) +
               " KV=" + std::to_string(d.kv_heads) + " hd=" + std::to_string(d.head_dim) +
               " (H must be a multiple of KV)");
  FT_CHECK(d.seq * std::max(d.heads, d.kv_heads) * d.head_dim < (int64_t(1) << 31),
           std::string(who) + ": rows exceed the 32-bit BLAS interface");
}

// Document ids of one batch row (null without a doc mask) and whether they never decrease
// (packed documents). Sorted ids let whole tiles of earlier documents be skipped; any other
// order is still masked exactly, element by element.
struct Docs {
  const int32_t* ids = nullptr;
  bool sorted = false;
  Docs(const int32_t* all, int64_t b, int64_t Tn) {
    if (all == nullptr) return;
    ids = all + b * Tn;
    sorted = std::is_sorted(ids, ids + Tn);
  }
  // First key a query of document `doc` can attend to (0 unless sorted).
  int64_t first_key(int64_t i) const {
    if (!ids || !sorted) return 0;
    return std::lower_bound(ids, ids + i, ids[i]) - ids;
  }
  // One past the last query that can attend to key j (Tn unless sorted).
  int64_t query_end(int64_t j, int64_t Tn) const {
    if (!ids || !sorted) return Tn;
    return std::upper_bound(ids + j, ids + Tn, ids[j]) - ids;
  }
};

// Keys [j0, j0 + cols) for query i: keys from `limit` on are in the future.
inline int64_t causal_limit(int64_t i, int64_t j0, int64_t cols) {
  return std::clamp<int64_t>(i - j0 + 1, 0, cols);
}

// Keys [j0, j0 + cols) for query i: keys before `first` are outside its window (0: none).
inline int64_t window_first(int64_t i, int64_t j0, int64_t cols, int64_t window) {
  return window > 0 ? std::clamp<int64_t>(i - window + 1 - j0, 0, cols) : 0;
}

// s := cap tanh(s / cap) over [c0, c1) of a score row, as the Softcap op computes it; `slope`
// (if not null) gets its derivative 1 - (s / cap)^2 for the backward.
template <class T>
inline void softcap_scores(T* row, int64_t c0, int64_t c1, T cap, T* slope) {
  const T inv = T(1) / cap;
  for (int64_t c = c0; c < c1; ++c) {
    row[c] = std::tanh(row[c] * inv) * cap;
    if (slope) {
      const T t = row[c] * inv;
      slope[c] = T(1) - t * t;
    }
  }
}

template <class T>
void forward_item(const T* q, const T* k, const T* v, const Docs& docs, T* o, T* lse,
                  const AttentionDims& d, T scale, int64_t b, int64_t h, T* S) {
  const int64_t Tn = d.seq, H = d.heads, KV = d.kv_heads, hd = d.head_dim;
  const int64_t ldq = H * hd, ldk = KV * hd;
  const int64_t kvh = h / (H / KV);
  const T* qh = q + b * Tn * ldq + h * hd;
  const T* kh = k + b * Tn * ldk + kvh * hd;
  const T* vh = v + b * Tn * ldk + kvh * hd;
  T* oh = o + b * Tn * ldq + h * hd;
  T* lh = lse + (b * H + h) * Tn;
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  T m[kBq];
  double l[kBq];
  for (int64_t i0 = 0; i0 < Tn; i0 += kBq) {
    const int64_t rows = std::min(kBq, Tn - i0);
    for (int64_t r = 0; r < rows; ++r) {
      m[r] = kNegInf;
      l[r] = 0.0;
      std::fill(oh + (i0 + r) * ldq, oh + (i0 + r) * ldq + hd, T(0));
    }
    const int64_t jend = i0 + rows;  // causal: no key after the block's last query
    int64_t jbegin = docs.first_key(i0);
    if (d.window > 0) jbegin = std::max<int64_t>(jbegin, i0 - d.window + 1);
    for (int64_t j0 = jbegin; j0 < jend; j0 += kBk) {
      const int64_t cols = std::min(kBk, jend - j0);
      mm(false, true, rows, cols, hd, scale, qh + i0 * ldq, ldq, kh + j0 * ldk, ldk, T(0), S, kBk);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = i0 + r;
        T* row = S + r * kBk;
        const int64_t limit = causal_limit(i, j0, cols);
        const int64_t first = std::min(limit, window_first(i, j0, cols, d.window));
        if (d.softcap > 0)
          softcap_scores(row, first, limit, T(d.softcap), static_cast<T*>(nullptr));
        for (int64_t c = 0; c < first; ++c) row[c] = kNegInf;
        if (docs.ids) {
          const int32_t di = docs.ids[i];
          const int32_t* dj = docs.ids + j0;
#pragma omp simd
          for (int64_t c = 0; c < limit; ++c) row[c] = dj[c] == di ? row[c] : kNegInf;
        }
        for (int64_t c = limit; c < cols; ++c) row[c] = kNegInf;
        const T mx = detail::row_max(row, limit);
        if (!(mx > kNegInf)) {  // no key of this tile is visible to row i
          std::fill(row, row + cols, T(0));
          continue;
        }
        const T m_new = std::max(m[r], mx);
        const T alpha = detail::vexp(m[r] - m_new);  // 0 on the row's first visible tile
        const double s = detail::sum_exp(row, m_new, row, cols);
        l[r] = l[r] * double(alpha) + s;
        m[r] = m_new;
        if (alpha != T(1)) {
          T* orow = oh + i * ldq;
#pragma omp simd
          for (int64_t c = 0; c < hd; ++c) orow[c] *= alpha;
        }
      }
      mm(false, false, rows, hd, cols, T(1), S, kBk, vh + j0 * ldk, ldk, T(1), oh + i0 * ldq, ldq);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = i0 + r;
      const T inv = T(1.0 / l[r]);
      T* orow = oh + i * ldq;
#pragma omp simd
      for (int64_t c = 0; c < hd; ++c) orow[c] *= inv;
      lh[i] = T(double(m[r]) + std::log(l[r]));
    }
  }
}

template <class T>
void backward_item(const T* q, const T* k, const T* v, const T* o, const T* lse, const T* dout,
                   const Docs& docs, T* dq, T* dk, T* dv, const AttentionDims& d, T scale,
                   int64_t b, int64_t kvh, T* P, T* dP, T* Dsum, T* slope) {
  const int64_t Tn = d.seq, H = d.heads, KV = d.kv_heads, hd = d.head_dim, G = H / KV;
  const int64_t ldq = H * hd, ldk = KV * hd;
  const T* kh = k + b * Tn * ldk + kvh * hd;
  const T* vh = v + b * Tn * ldk + kvh * hd;
  T* dkh = dk + b * Tn * ldk + kvh * hd;
  T* dvh = dv + b * Tn * ldk + kvh * hd;
  // D[i] = sum_c do[i, c] o[i, c] (= sum_j P_ij dP_ij), and zeroed dq rows, per query head.
  for (int64_t g = 0; g < G; ++g) {
    const int64_t h = kvh * G + g;
    for (int64_t i = 0; i < Tn; ++i) {
      const T* orow = o + (b * Tn + i) * ldq + h * hd;
      const T* drow = dout + (b * Tn + i) * ldq + h * hd;
      T s = T(0);
#pragma omp simd reduction(+ : s)
      for (int64_t c = 0; c < hd; ++c) s += orow[c] * drow[c];
      Dsum[g * Tn + i] = s;
      std::fill(dq + (b * Tn + i) * ldq + h * hd, dq + (b * Tn + i) * ldq + h * hd + hd, T(0));
    }
  }
  for (int64_t j = 0; j < Tn; ++j) {
    std::fill(dkh + j * ldk, dkh + j * ldk + hd, T(0));
    std::fill(dvh + j * ldk, dvh + j * ldk + hd, T(0));
  }
  for (int64_t j0 = 0; j0 < Tn; j0 += kBk) {
    const int64_t cols = std::min(kBk, Tn - j0);
    int64_t iend = docs.query_end(j0 + cols - 1, Tn);
    if (d.window > 0) iend = std::min(iend, j0 + cols - 1 + d.window);
    for (int64_t g = 0; g < G; ++g) {
      const int64_t h = kvh * G + g;
      const T* qh = q + b * Tn * ldq + h * hd;
      const T* doh = dout + b * Tn * ldq + h * hd;
      T* dqh = dq + b * Tn * ldq + h * hd;
      const T* lh = lse + (b * H + h) * Tn;
      for (int64_t i0 = j0; i0 < iend; i0 += kBq) {  // queries before j0 see none of these keys
        const int64_t rows = std::min(kBq, iend - i0);
        mm(false, true, rows, cols, hd, scale, qh + i0 * ldq, ldq, kh + j0 * ldk, ldk, T(0), P,
           kBk);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = i0 + r;
          T* row = P + r * kBk;
          const int64_t limit = causal_limit(i, j0, cols);
          const int64_t first = std::min(limit, window_first(i, j0, cols, d.window));
          const T li = lh[i];
          if (d.softcap > 0) softcap_scores(row, first, limit, T(d.softcap), slope + r * kBk);
          if (docs.ids) {
            const int32_t di = docs.ids[i];
            const int32_t* dj = docs.ids + j0;
#pragma omp simd
            for (int64_t c = first; c < limit; ++c)
              row[c] = dj[c] == di ? detail::vexp(row[c] - li) : T(0);
          } else {
#pragma omp simd
            for (int64_t c = first; c < limit; ++c) row[c] = detail::vexp(row[c] - li);
          }
          for (int64_t c = 0; c < first; ++c) row[c] = T(0);
          for (int64_t c = limit; c < cols; ++c) row[c] = T(0);
        }
        // dV_j += P^T dO_i;  dP = dO_i V_j^T
        mm(true, false, cols, hd, rows, T(1), P, kBk, doh + i0 * ldq, ldq, T(1), dvh + j0 * ldk,
           ldk);
        mm(false, true, rows, cols, hd, T(1), doh + i0 * ldq, ldq, vh + j0 * ldk, ldk, T(0), dP,
           kBk);
        // dS = P * (dP - D_i), kept in dP; the softmax scale goes into the next two GEMMs.
        for (int64_t r = 0; r < rows; ++r) {
          const T Di = Dsum[g * Tn + i0 + r];
          const T* prow = P + r * kBk;
          T* drow = dP + r * kBk;
#pragma omp simd
          for (int64_t c = 0; c < cols; ++c) drow[c] = prow[c] * (drow[c] - Di);
          if (d.softcap > 0) {  // through the cap: times its slope (0 where P is 0 anyway)
            const T* srow = slope + r * kBk;
            for (int64_t c = 0; c < cols; ++c) drow[c] = prow[c] == T(0) ? T(0) : drow[c] * srow[c];
          }
        }
        // dQ_i += scale dS K_j;  dK_j += scale dS^T Q_i
        mm(false, false, rows, hd, cols, scale, dP, kBk, kh + j0 * ldk, ldk, T(1), dqh + i0 * ldq,
           ldq);
        mm(true, false, cols, hd, rows, scale, dP, kBk, qh + i0 * ldq, ldq, T(1), dkh + j0 * ldk,
           ldk);
      }
    }
  }
}

int threads_for(int64_t items) {
  return int(std::max<int64_t>(1, std::min<int64_t>(omp_get_max_threads(), items)));
}

}  // namespace

int64_t flash_attention_workspace_bytes(const AttentionDims& d, int64_t elem_bytes, bool backward,
                                        int threads) {
  const int64_t items = backward ? d.batch * d.kv_heads : d.batch * d.heads;
  const int64_t t = std::max<int64_t>(1, std::min<int64_t>(threads, items));
  const int64_t tiles = 2 + (d.softcap > 0 ? 1 : 0);  // P, dP and the cap's slope
  const int64_t per = backward
                          ? tiles * kBq * kBk + (d.heads / std::max<int64_t>(1, d.kv_heads)) * d.seq
                          : kBq * kBk;
  return t * per * elem_bytes;
}

template <class T>
void flash_attention_forward(const T* q, const T* k, const T* v, const int32_t* doc_ids, T* o,
                             T* lse, const AttentionDims& d, double scale) {
  check_dims(d, "flash_attention_forward");
  const int64_t items = d.batch * d.heads;
  if (items == 0 || d.seq == 0) return;
  const int nt = threads_for(items);
  const int64_t per = kBq * kBk;
  Tensor scratch = Tensor::empty({nt * per}, dtype_of<T>());
  T* base = scratch.data<T>();
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t item = 0; item < items; ++item) {
    const int64_t b = item / d.heads, h = item % d.heads;
    const Docs docs(doc_ids, b, d.seq);
    forward_item<T>(q, k, v, docs, o, lse, d, T(scale), b, h, base + omp_get_thread_num() * per);
  }
}

template <class T>
void flash_attention_backward(const T* q, const T* k, const T* v, const T* o, const T* lse,
                              const T* dout, const int32_t* doc_ids, T* dq, T* dk, T* dv,
                              const AttentionDims& d, double scale) {
  check_dims(d, "flash_attention_backward");
  const int64_t items = d.batch * d.kv_heads;
  if (items == 0 || d.seq == 0) return;
  const int nt = threads_for(items);
  const int64_t G = d.heads / d.kv_heads;
  const int64_t tiles = 2 + (d.softcap > 0 ? 1 : 0);  // P, dP and the cap's slope
  const int64_t per = tiles * kBq * kBk + G * d.seq;
  Tensor scratch = Tensor::empty({nt * per}, dtype_of<T>());
  T* base = scratch.data<T>();
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t item = 0; item < items; ++item) {
    const int64_t b = item / d.kv_heads, kvh = item % d.kv_heads;
    const Docs docs(doc_ids, b, d.seq);
    T* mine = base + omp_get_thread_num() * per;
    backward_item<T>(q, k, v, o, lse, dout, docs, dq, dk, dv, d, T(scale), b, kvh, mine,
                     mine + kBq * kBk, mine + tiles * kBq * kBk, mine + 2 * kBq * kBk);
  }
}

#define FT_INSTANTIATE(T)                                                                        \
  template void flash_attention_forward<T>(const T*, const T*, const T*, const int32_t*, T*, T*, \
                                           const AttentionDims&, double);                        \
  template void flash_attention_backward<T>(const T*, const T*, const T*, const T*, const T*,    \
                                            const T*, const int32_t*, T*, T*, T*,                \
                                            const AttentionDims&, double);
FT_INSTANTIATE(float)
FT_INSTANTIATE(double)
#undef FT_INSTANTIATE

}  // namespace fusetune::kernels
