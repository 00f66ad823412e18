#include "fusetune/kernels/cpu/nf4.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "fusetune/core/tensor.h"
#include "fusetune/kernels/cpu/decode_gemv.h"
#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/kernels/cpu/nf4_bf16_matmul.h"
#include "fusetune/kernels/cpu/parallel.h"
#include "fusetune/util/error.h"

namespace fusetune::kernels {
namespace {

// bitsandbytes' NF4 code book (functional.py get_4bit_type("nf4")).
constexpr float kNF4[16] = {-1.0f,
                            -0.6961928009986877f,
                            -0.5250730514526367f,
                            -0.39491748809814453f,
                            -0.28444138169288635f,
                            -0.18477343022823334f,
                            -0.09105003625154495f,
                            0.0f,
                            0.07958029955625534f,
                            0.16093020141124725f,
                            0.24611230194568634f,
                            0.33791524171829224f,
                            0.44070982933044434f,
                            0.5626170039176941f,
                            0.7229568362236328f,
                            1.0f};

// bitsandbytes create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): for
// exponent i in 0..6, 2^i fraction steps (midpoints of linspace(0.1, 1, 2^i + 1)) times
// 10^(i-6), both signs, plus 0 and 1; sorted.
std::vector<float> build_dynamic_map() {
  std::vector<float> data;
  for (int i = 0; i < 7; ++i) {
    const int items = (1 << i) + 1;
    for (int k = 0; k + 1 < items; ++k) {
      const double b0 = 0.1 + 0.9 * double(k) / double(items - 1);
      const double b1 = 0.1 + 0.9 * double(k + 1) / double(items - 1);
      const double v = std::pow(10.0, double(i - 6)) * (b0 + b1) / 2.0;
      data.push_back(float(v));
      data.push_back(float(-v));
    }
  }
  data.push_back(0.0f);
  data.push_back(1.0f);
  std::sort(data.begin(), data.end());
  return data;
}

int nearest(const float* table, int n, float v) {
  const float* it = std::lower_bound(table, table + n, v);
  int hi = int(it - table);
  if (hi == 0) return 0;
  if (hi == n) return n - 1;
  return (v - table[hi - 1]) <= (table[hi] - v) ? hi - 1 : hi;
}

// nearest(kNF4, 16, v[k]) for a block of kNF4Block, without branches so that it vectorizes (8B
// QLoRA quantizes ~6.5e9 weights at load). The code is the number of table gaps [t_j, t_j+1] whose
// upper end is strictly nearer than the lower one: the same comparison nearest() makes on the
// gap holding v (every gap below it counts, none above), hence the same bits, ties included.
inline void nearest_nf4_codes(const float* v, int32_t* c) {
  for (int64_t k = 0; k < kNF4Block; ++k) c[k] = 0;
  for (int j = 0; j + 1 < 16; ++j) {
    const float lo = kNF4[j], hi = kNF4[j + 1];
#pragma omp simd
    for (int64_t k = 0; k < kNF4Block; ++k) c[k] += (v[k] - lo) > (hi - v[k]) ? 1 : 0;
  }
}

// v[k] = w[k] / d rounded to float. A float w is divided in float: twice the SIMD lanes, and
// the same bits as dividing in double and rounding (double rounding of a quotient is harmless
// when the wide type has at least 2p + 2 bits: 53 >= 2 * 24 + 2).
template <class T>
inline void scale_block(const T* w, float d, float* v) {
  if constexpr (std::is_same_v<T, float>) {
#pragma omp simd
    for (int64_t k = 0; k < kNF4Block; ++k) v[k] = w[k] / d;
  } else {
#pragma omp simd
    for (int64_t k = 0; k < kNF4Block; ++k) v[k] = float(double(w[k]) / double(d));
  }
}

inline int code_at(const int32_t* codes, int64_t i) {
  return int((uint32_t(codes[i >> 3]) >> (4 * (i & 7))) & 15u);
}

// o[k] = W_flat[i0 + k] for k < i1 - i0: one absmax look-up per block of 64.
template <class T>
void dequantize_range(const NF4View& w, int64_t i0, int64_t i1, T* o) {
  int64_t i = i0;
  while (i < i1) {
    const int64_t b = i / kNF4Block;
    const int64_t e = std::min(i1, (b + 1) * kNF4Block);
    const T am = T(nf4_block_absmax(w, b));
    for (; i < e; ++i) o[i - i0] = T(kNF4[code_at(w.codes, i)]) * am;
  }
}

}  // namespace

int64_t nf4_tile_rows(int64_t rows, int64_t cols) {
  const int64_t by_bytes = (int64_t(1) << 18) / std::max<int64_t>(1, cols);  // 1 MiB of fp32
  return std::max<int64_t>(1, std::min(rows, std::max<int64_t>(256, by_bytes)));
}

const float* nf4_table() { return kNF4; }

const float* nf4_dynamic_map() {
  static const std::vector<float> m = build_dynamic_map();
  return m.data();
}

NF4Sizes nf4_sizes(int64_t numel) {
  NF4Sizes s;
  s.blocks = (numel + kNF4Block - 1) / kNF4Block;
  s.code_words = (numel + 7) / 8;
  s.absmax_words = (s.blocks + 3) / 4;
  s.scales = (s.blocks + kNF4AbsmaxBlock - 1) / kNF4AbsmaxBlock;
  return s;
}

template <class T>
void nf4_quantize_blocks(const T* w, int64_t n, int32_t* codes, float* absmax) {
  const int64_t blocks = (n + kNF4Block - 1) / kNF4Block;
  // Parallel over blocks: block b alone writes its 8 code words and absmax[b] (the bits do not
  // depend on the thread count). An 8B QLoRA base is ~6.5e9 weights.
#pragma omp parallel for schedule(static) if (n >= detail::kParallelMin)
  for (int64_t b = 0; b < blocks; ++b) {
    // Every loop runs over a whole block of 64 so that it vectorizes: the tail block's missing
    // elements are 0 (code 7, as a zero weight) and their code bits 0, as before.
    const int64_t i0 = b * kNF4Block, len = std::min(n - i0, kNF4Block);
    T tail[kNF4Block];
    const T* wb = w + i0;
    if (len < kNF4Block) {
      std::fill(std::copy(wb, wb + len, tail), tail + kNF4Block, T(0));
      wb = tail;
    }
    float am = 0;
#pragma omp simd reduction(max : am)
    for (int64_t k = 0; k < kNF4Block; ++k) am = std::max(am, float(std::abs(wb[k])));
    absmax[b] = am;
    const float d = am > 0 ? am : 1.0f;  // an all-zero block: every v is 0, code 7
    float v[kNF4Block];
    scale_block(wb, d, v);
    int32_t c[kNF4Block];
    nearest_nf4_codes(v, c);
    for (int64_t k = len; k < kNF4Block; ++k) c[k] = 0;
    int32_t* out = codes + (i0 >> 3);  // a block is 8 whole code words
    for (int64_t q = 0; q < (len + 7) / 8; ++q) {
      uint32_t word = 0;
      for (int r = 0; r < 8; ++r) word |= uint32_t(c[8 * q + r]) << (4 * r);
      out[q] = int32_t(word);
    }
  }
}

void nf4_quantize_absmax(const float* absmax, int64_t blocks, int32_t* absmax_codes,
                         float* absmax_scales, float* offset) {
  const NF4Sizes s = nf4_sizes(blocks * kNF4Block);
  std::fill(absmax_codes, absmax_codes + s.absmax_words, 0);
  // Double quantization (bitsandbytes: absmax - mean, then blockwise 8-bit dynamic map).
  double mean = 0;
  for (int64_t b = 0; b < blocks; ++b) mean += absmax[b];
  mean = blocks ? mean / double(blocks) : 0.0;
  *offset = float(mean);
  const float* map = nf4_dynamic_map();
  // A scale block's 256 absmax codes fill whole int32 words (4 per word): no word is shared.
  static_assert(kNF4AbsmaxBlock % 4 == 0);
#pragma omp parallel for schedule(static) if (s.scales >= 16)
  for (int64_t sb = 0; sb < s.scales; ++sb) {
    const int64_t b0 = sb * kNF4AbsmaxBlock, b1 = std::min(blocks, b0 + kNF4AbsmaxBlock);
    float scale = 0;
    for (int64_t b = b0; b < b1; ++b) scale = std::max(scale, std::abs(absmax[b] - *offset));
    absmax_scales[sb] = scale;
    for (int64_t b = b0; b < b1; ++b) {
      const float v = scale > 0 ? (absmax[b] - *offset) / scale : 0.0f;
      const int c = nearest(map, 256, v);
      absmax_codes[b >> 2] =
          int32_t(uint32_t(absmax_codes[b >> 2]) | (uint32_t(c) << (8 * (b & 3))));
    }
  }
}

template <class T>
void nf4_quantize(const T* w, int64_t n, int32_t* codes, int32_t* absmax_codes,
                  float* absmax_scales, float* offset) {
  const NF4Sizes s = nf4_sizes(n);
  std::vector<float> absmax(size_t(s.blocks), 0.0f);
  nf4_quantize_blocks(w, n, codes, absmax.data());
  nf4_quantize_absmax(absmax.data(), s.blocks, absmax_codes, absmax_scales, offset);
}

float nf4_block_absmax(const NF4View& w, int64_t b) {
  const int c = int((uint32_t(w.absmax_codes[b >> 2]) >> (8 * (b & 3))) & 255u);
  return nf4_dynamic_map()[c] * w.absmax_scales[b / kNF4AbsmaxBlock] + w.offset;
}

template <class T>
void nf4_dequantize_rows(const NF4View& w, int64_t r0, int64_t r1, T* out) {
  const int64_t K = w.cols;
#pragma omp parallel for schedule(static) if ((r1 - r0) * K >= detail::kParallelMin)
  for (int64_t r = r0; r < r1; ++r) dequantize_range(w, r * K, (r + 1) * K, out + (r - r0) * K);
}

template <class T>
void nf4_gather_rows(const NF4View& w, const int32_t* ids, int64_t n, T* out) {
  const int64_t K = w.cols;
  for (int64_t i = 0; i < n; ++i)
    FT_CHECK(ids[i] >= 0 && ids[i] < w.rows, "NF4 embedding: token id " + std::to_string(ids[i]) +
                                                 " at position " + std::to_string(i) +
                                                 " is outside the vocabulary of size " +
                                                 std::to_string(w.rows));
#pragma omp parallel for schedule(static) if (n * K >= detail::kParallelMin)
  for (int64_t i = 0; i < n; ++i)
    dequantize_range(w, int64_t(ids[i]) * K, int64_t(ids[i] + 1) * K, out + i * K);
}

template <class T>
void nf4_matmul(const NF4View& w, const T* x, int64_t N, T* y) {
  if constexpr (std::is_same_v<T, float>) {
    if (N <= kDecodeGemvMaxRows && decode_gemv_nf4_weight(N, w, x, y)) return;  // a decode step
    if (nf4_matmul_bf16(w, x, N, y)) return;  // a bf16 graph on bf16 dot products
  }
  const int64_t tr = nf4_tile_rows(w.rows, w.cols), K = w.cols, O = w.rows;
  Tensor tile_buf = Tensor::empty({tr, K}, dtype_of<T>());  // counted scratch
  T* tile = tile_buf.data<T>();
  for (int64_t r0 = 0; r0 < O; r0 += tr) {
    const int64_t r1 = std::min(O, r0 + tr);
    nf4_dequantize_rows(w, r0, r1, tile);
    gemm<T>(false, true, N, r1 - r0, K, T(1), x, K, tile, K, T(0), y + r0, O);
  }
}

template <class T>
void nf4_matmul_backward(const NF4View& w, const T* dy, int64_t N, T* dx) {
  if constexpr (std::is_same_v<T, float>)
    if (nf4_matmul_backward_bf16(w, dy, N, dx)) return;  // a bf16 graph on bf16 dot products
  const int64_t tr = nf4_tile_rows(w.rows, w.cols), K = w.cols, O = w.rows;
  Tensor tile_buf = Tensor::empty({tr, K}, dtype_of<T>());  // counted scratch
  T* tile = tile_buf.data<T>();
  for (int64_t r0 = 0; r0 < O; r0 += tr) {
    const int64_t r1 = std::min(O, r0 + tr);
    nf4_dequantize_rows(w, r0, r1, tile);
    gemm<T>(false, false, N, K, r1 - r0, T(1), dy + r0, O, tile, K, r0 == 0 ? T(0) : T(1), dx, K);
  }
}

#define FT_NF4(T)                                                                       \
  template void nf4_quantize<T>(const T*, int64_t, int32_t*, int32_t*, float*, float*); \
  template void nf4_quantize_blocks<T>(const T*, int64_t, int32_t*, float*);            \
  template void nf4_dequantize_rows<T>(const NF4View&, int64_t, int64_t, T*);           \
  template void nf4_gather_rows<T>(const NF4View&, const int32_t*, int64_t, T*);        \
  template void nf4_matmul<T>(const NF4View&, const T*, int64_t, T*);                   \
  template void nf4_matmul_backward<T>(const NF4View&, const T*, int64_t, T*);
FT_NF4(float)
FT_NF4(double)
#undef FT_NF4

}  // namespace fusetune::kernels
