#pragma once
// The inner loop of the decode GEMV (decode_gemv.h), shared by its weight formats: a block of
// MB rows of x against NB rows of the weight. A weight format is a `Rows` reader that yields
// 16-element pieces of a row as fp32 (widened or dequantized in registers) and single elements
// for the tail. Internal to kernels/cpu/decode_gemv*.cpp.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "fusetune/core/dtype.h"
#include "fusetune/kernels/cpu/nf4.h"

namespace fusetune::kernels {

inline constexpr int kGemvLanes = 16;  // one AVX-512 register of fp32 (two AVX2 ones)

// Writes a block's sums acc [M, ld] (its first nb columns) to y's columns n0.. (y [M, N], fp32 or
// bf16 rounded once).
inline void store_gemv_block(const float* acc, int64_t ld, int64_t M, int64_t N, int64_t n0,
                             int64_t nb, void* y, bool y_bf16) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < nb; ++j) {
      const float v = acc[m * ld + j];
      if (y_bf16)
        static_cast<uint16_t*>(y)[m * N + n0 + j] = f32_to_bf16(v);
      else
        static_cast<float*>(y)[m * N + n0 + j] = v;
    }
}

inline float gemv_widen(uint16_t v) {
  const uint32_t bits = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// A bf16 weight [N, K], row-major.
struct Bf16Rows {
  const uint16_t* w;
  int64_t K;
  const void* at(int64_t n, int64_t k) const { return w + n * K + k; }
  float element(int64_t n, int64_t k) const { return gemv_widen(w[n * K + k]); }
  void piece(int64_t n, int64_t k, float* out) const {
#pragma omp simd
    for (int l = 0; l < kGemvLanes; ++l) out[l] = gemv_widen(w[n * K + k + l]);
  }
#ifdef __AVX512F__
  __m512 piece(int64_t n, int64_t k) const {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + n * K + k));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
  }
#endif
};

// An NF4 weight (nf4.h) whose rows are whole 16-element pieces (cols % 16 == 0): a piece is
// two code words inside one 64-element block, its values table[code] * absmax, the product
// nf4_dequantize_rows forms, so the weight is the one the GEMM path multiplies by. The tables
// are looked up once, not per piece.
struct Nf4Rows {
  const NF4View& w;
  const float* table = nf4_table();
  const float* dynamic_map = nf4_dynamic_map();
#ifdef __AVX512F__
  __m512 table_vector = _mm512_loadu_ps(nf4_table());
#endif
  // nf4_block_absmax, inline.
  float absmax(int64_t b) const {
    const int c = int((uint32_t(w.absmax_codes[b >> 2]) >> (8 * (b & 3))) & 255u);
    return dynamic_map[c] * w.absmax_scales[b / kNF4AbsmaxBlock] + w.offset;
  }
  const void* at(int64_t n, int64_t k) const { return w.codes + (n * w.cols + k) / 8; }
  float element(int64_t n, int64_t k) const {
    const int64_t i = n * w.cols + k;
    const int code = int((uint32_t(w.codes[i / 8]) >> (4 * (i % 8))) & 15u);
    return table[code] * absmax(i / kNF4Block);
  }
  void piece(int64_t n, int64_t k, float* out) const {
    for (int l = 0; l < kGemvLanes; ++l) out[l] = element(n, k + l);
  }
#ifdef __AVX512F__
  __m512 piece(int64_t n, int64_t k) const {
    const int64_t i = n * w.cols + k;
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.codes + i / 8));
    const __m128i nibble = _mm_set1_epi8(15);
    // Element 2b is byte b's low nibble, 2b + 1 its high one.
    const __m128i codes = _mm_unpacklo_epi8(_mm_and_si128(bytes, nibble),
                                            _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble));
    const __m512 values = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(codes), table_vector);
    return _mm512_mul_ps(values, _mm512_set1_ps(absmax(i / kNF4Block)));
  }
#endif
};

// out[m * NB + j] = x[m, :] . W[n0 + j, :] for MB rows of x (row stride K) and NB weight rows.
// Each 16-element piece of the NB weight rows is made fp32 once, in registers, and multiplied
// into MB x NB vector accumulators, so every load of x serves NB products and every weight
// piece MB; the lanes are summed once at the end, in a fixed order, then the tail past the
// last full piece.
#ifdef __AVX512F__
// GCC 12 reports its own intrinsics' deliberately undefined lanes as maybe-uninitialized.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
template <int MB, int NB, class Rows>
void gemv_block_dot(const float* x, int64_t K, const Rows& w, int64_t n0, float* out) {
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
        // The weight streams from memory once: ask for it well ahead (512 elements per row).
        if (u == 0) _mm_prefetch(static_cast<const char*>(w.at(n0 + j, k + 512)), _MM_HINT_T0);
        wf[j] = w.piece(n0 + j, ku);
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
      for (int64_t t = k; t < K; ++t) s = std::fma(x[m * K + t], w.element(n0 + j, t), s);
      out[m * NB + j] = s;
    }
}
#pragma GCC diagnostic pop
#else
// Without AVX-512 the same sums, written for the compiler to vectorize.
template <int MB, int NB, class Rows>
void gemv_block_dot(const float* x, int64_t K, const Rows& w, int64_t n0, float* out) {
  float acc[MB][NB][kGemvLanes] = {};
  int64_t k = 0;
  for (; k + kGemvLanes <= K; k += kGemvLanes)
    for (int j = 0; j < NB; ++j) {
      float wf[kGemvLanes];
      w.piece(n0 + j, k, wf);
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
      for (int64_t t = k; t < K; ++t) s = std::fma(x[m * K + t], w.element(n0 + j, t), s);
      out[m * NB + j] = s;
    }
}
#endif

}  // namespace fusetune::kernels
