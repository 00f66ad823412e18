#include "fusetune/kernels/cpu/decode_gemv.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "fusetune/core/dtype.h"
#include "fusetune/core/tensor.h"
#include "fusetune/kernels/cpu/bf16.h"
#include "fusetune/kernels/cpu/parallel.h"
#include "fusetune/util/error.h"

namespace fusetune::kernels {

namespace {

constexpr int kGemvLanes = 16;  // one AVX-512 register of fp32 (two AVX2 ones)

inline float gemv_widen(uint16_t v) {
  const uint32_t bits = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// out[m * NB + j] = x[m, :] . w[j, :] for MB rows of x and NB rows of the weight (both row
// stride K). Each 16-element piece of the NB weight rows is widened once, in registers, and
// multiplied into MB x NB vector accumulators, so every load of x serves NB products and every
// widened weight piece MB; the lanes are summed once at the end, in a fixed order, then the
// tail past the last full piece.
#ifdef __AVX512F__
// GCC 12 reports its own intrinsics' deliberately undefined lanes as maybe-uninitialized.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
template <int MB, int NB>
void gemv_block_dot(const float* x, int64_t K, const uint16_t* w, float* out) {
  // U pieces per step, each into its own accumulators: few rows (M = 1) would otherwise wait
  // on the FMA latency of MB x NB chains.
  constexpr int U = MB * NB >= 8 ? 1 : 2;
  __m512 acc[U][MB][NB];
  for (int u = 0; u < U; ++u)
    for (int m = 0; m < MB; ++m)
      for (int j = 0; j < NB; ++j) acc[u][m][j] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + U * kGemvLanes <= K; k += U * kGemvLanes)
    for (int u = 0; u < U; ++u) {
      const int64_t ku = k + u * kGemvLanes;
      __m512 wf[NB];
      for (int j = 0; j < NB; ++j) {
        // The weight streams from memory once: ask for it well ahead (1 KiB per row).
        if (u == 0) _mm_prefetch(reinterpret_cast<const char*>(w + j * K + k + 512), _MM_HINT_T0);
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + j * K + ku));
        wf[j] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
      }
      for (int m = 0; m < MB; ++m) {
        const __m512 xv = _mm512_loadu_ps(x + m * K + ku);
        for (int j = 0; j < NB; ++j) acc[u][m][j] = _mm512_fmadd_ps(xv, wf[j], acc[u][m][j]);
      }
    }
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < NB; ++j) {
      __m512 sum = acc[0][m][j];
      for (int u = 1; u < U; ++u) sum = _mm512_add_ps(sum, acc[u][m][j]);
      float s = _mm512_reduce_add_ps(sum);
      for (int64_t t = k; t < K; ++t) s = std::fma(x[m * K + t], gemv_widen(w[j * K + t]), s);
      out[m * NB + j] = s;
    }
}
#pragma GCC diagnostic pop
#else
// Without AVX-512 the same sums, written for the compiler to vectorize.
template <int MB, int NB>
void gemv_block_dot(const float* x, int64_t K, const uint16_t* w, float* out) {
  float acc[MB][NB][kGemvLanes] = {};
  int64_t k = 0;
  for (; k + kGemvLanes <= K; k += kGemvLanes)
    for (int j = 0; j < NB; ++j) {
      float wf[kGemvLanes];
#pragma omp simd
      for (int l = 0; l < kGemvLanes; ++l) wf[l] = gemv_widen(w[j * K + k + l]);
      for (int m = 0; m < MB; ++m) {
        const float* xr = x + m * K + k;
#pragma omp simd
        for (int l = 0; l < kGemvLanes; ++l) acc[m][j][l] = std::fma(xr[l], wf[l], acc[m][j][l]);
      }
    }
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < NB; ++j) {
      float s = 0.0f;
      for (int l = 0; l < kGemvLanes; ++l) s += acc[m][j][l];
      for (int64_t t = k; t < K; ++t) s = std::fma(x[m * K + t], gemv_widen(w[j * K + t]), s);
      out[m * NB + j] = s;
    }
}
#endif

constexpr int kGemvRowBlock = 4;  // weight rows per block (and rows of x at a time)

// Products of every row of x with NB weight rows from w into out [M, NB]: x in blocks of 4,
// 2 and 1 rows.
template <int NB>
void gemv_rows_dot(const float* x, int64_t M, int64_t K, const uint16_t* w, float* out) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) gemv_block_dot<4, NB>(x + m * K, K, w, out + m * NB);
  if (m + 2 <= M) gemv_block_dot<2, NB>(x + m * K, K, w, out + m * NB), m += 2;
  if (m < M) gemv_block_dot<1, NB>(x + m * K, K, w, out + m * NB);
}

}  // namespace

void decode_gemv_bf16_weight(int64_t M, int64_t N, int64_t K, const void* x, bool x_bf16,
                             const uint16_t* w, void* y, bool y_bf16) {
  FT_CHECK(M >= 0 && M <= kDecodeGemvMaxRows, "decode_gemv: M must be <= kDecodeGemvMaxRows");
  if (M == 0 || N == 0) return;
  // x is small (M rows): widen it once, whole (a counted scratch tensor).
  Tensor x_wide;
  const float* xs = static_cast<const float*>(x);
  if (x_bf16) {
    x_wide = Tensor::empty({M, K}, DType::F32);
    bf16_to_f32_array(static_cast<const uint16_t*>(x), x_wide.data<float>(), M * K);
    xs = x_wide.data<float>();
  }
  const int64_t blocks = (N + kGemvRowBlock - 1) / kGemvRowBlock;
#pragma omp parallel for schedule(static) if (N * K >= detail::kParallelMin)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t n0 = b * kGemvRowBlock, nb = std::min<int64_t>(kGemvRowBlock, N - n0);
    float acc[kDecodeGemvMaxRows * kGemvRowBlock];  // [M, nb]
    if (nb == kGemvRowBlock)
      gemv_rows_dot<kGemvRowBlock>(xs, M, K, w + n0 * K, acc);
    else
      for (int64_t j = 0; j < nb; ++j) {
        float one[kDecodeGemvMaxRows];
        gemv_rows_dot<1>(xs, M, K, w + (n0 + j) * K, one);
        for (int64_t m = 0; m < M; ++m) acc[m * nb + j] = one[m];
      }
    for (int64_t m = 0; m < M; ++m)
      for (int64_t j = 0; j < nb; ++j) {
        const float v = acc[m * nb + j];
        if (y_bf16)
          static_cast<uint16_t*>(y)[m * N + n0 + j] = f32_to_bf16(v);
        else
          static_cast<float*>(y)[m * N + n0 + j] = v;
      }
  }
}

}  // namespace fusetune::kernels
