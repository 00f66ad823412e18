#pragma once
// The LM head's products for one chunk of c gathered hidden rows, shared by the fused
// linear + cross-entropy and linear + log-prob kernels: a dense W [V, D], or an NF4 or bf16 W
// widened a tile of rows at a time (the tile is the only fp32 copy of any part of W), or a W
// fake-quantized a tile of rows at a time (QAT: the tile is the only fake-quantized copy); and,
// on the CPU's bf16 dot products, a bf16 W as stored or NF4 / fake-quantized tiles rounded to
// bf16 (OneDnnBf16Head, OneDnnTiledHead).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fusetune/core/dtype.h"
#include "fusetune/kernels/cpu/bf16.h"
#include "fusetune/kernels/cpu/bf16_matmul.h"
#include "fusetune/kernels/cpu/fake_quant.h"
#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/kernels/cpu/nf4.h"
#include "fusetune/util/error.h"

namespace fusetune::kernels::detail {

template <class T>
struct DenseHead {
  const T* W;
  int64_t D, V;
  void logits(const T* hc, int64_t c, T* z) const {  // z [c, V] = hc W^T
    gemm<T>(false, true, c, V, D, T(1), hc, D, W, D, T(0), z, V);
  }
  void grad_h(const T* z, int64_t c, T* dhc) const {  // dhc [c, D] = z W
    gemm<T>(false, false, c, D, V, T(1), z, V, W, D, T(0), dhc, D);
  }
};

// dW [V, D] (+)= z^T hc: a trainable head's gradient from one chunk, written by the first
// chunk (accumulate false) and summed into by the others.
template <class T>
void head_grad_w(const T* z, const T* hc, int64_t c, int64_t D, int64_t V, T* dW, bool accumulate) {
  gemm<T>(true, false, V, D, c, T(1), z, V, hc, D, T(accumulate ? 1 : 0), dW, D);
}

// Widen rows [r0, r1) of a compressed W into out: NF4 codes or bf16 values.
struct NF4Rows {
  const NF4View& w;
  template <class T>
  void operator()(int64_t r0, int64_t r1, T* out) const {
    nf4_dequantize_rows(w, r0, r1, out);
  }
};
struct BF16Rows {
  const uint16_t* w;
  int64_t cols;
  void operator()(int64_t r0, int64_t r1, float* out) const {
    bf16_to_f32_array(w + r0 * cols, out, (r1 - r0) * cols);
  }
  void operator()(int64_t r0, int64_t r1, double* out) const {
    for (int64_t i = r0 * cols; i < r1 * cols; ++i) *out++ = bf16_to_f32(w[i]);
  }
};

// Rows [r0, r1) of fq(W) (float/double, or bf16 widened first), fake_quant.h's FakeQuantWeight:
// a Q6_K head keeps its scales for every tile of every chunk.
template <class W>
struct FakeQuantRows {
  const FakeQuantWeight<W>& w;
  template <class T>
  void operator()(int64_t r0, int64_t r1, T* out) const {
    w.rows(r0, r1, out);
  }
};

// A head stored compressed (Rows: NF4Rows or BF16Rows) or fake-quantized (FakeQuantRows),
// formed a tile of rows at a time.
template <class T, class Rows>
struct TiledHead {
  Rows W;
  int64_t D, V, tile_rows;
  T* tile;  // [tile_rows, D]
  void logits(const T* hc, int64_t c, T* z) const {
    for (int64_t v0 = 0; v0 < V; v0 += tile_rows) {
      const int64_t v1 = std::min(V, v0 + tile_rows);
      W(v0, v1, tile);
      gemm<T>(false, true, c, v1 - v0, D, T(1), hc, D, tile, D, T(0), z + v0, V);
    }
  }
  void grad_h(const T* z, int64_t c, T* dhc) const {
    for (int64_t v0 = 0; v0 < V; v0 += tile_rows) {
      const int64_t v1 = std::min(V, v0 + tile_rows);
      W(v0, v1, tile);
      gemm<T>(false, false, c, D, v1 - v0, T(1), z + v0, V, tile, D, v0 == 0 ? T(0) : T(1), dhc, D);
    }
  }
};
template <class T>
using NF4Head = TiledHead<T, NF4Rows>;
template <class T>
using BF16Head = TiledHead<T, BF16Rows>;

// Row x [n] fp32 := its values rounded to bf16, packed into the row's first 2n bytes (a block
// at a time through a small buffer: a block's bf16 lands on fp32 values already read).
void round_row_to_bf16_in_place(float* x, int64_t n);

// The bf16 logit gradients of a chunk, in the first half of each fp32 row of z (round_row).
inline const uint16_t* bf16_logit_grads(const float* z) {
  return reinterpret_cast<const uint16_t*>(z);
}

// dW [V, D] (+)= dz^T hc on bf16 dot products, dz the chunk's bf16 logit gradients.
void bf16_head_grad_w(const float* z, const uint16_t* hc_bf16, int64_t c, int64_t D, int64_t V,
                      float* dW, bool accumulate);

// A bf16 head on the CPU's bf16 dot products (oneDNN, bf16_matmul.h), for an h that holds bf16
// values (holds_bf16_values: a bf16 graph's), so rounding the chunk's rows to bf16 is exact.
// The logits come out fp32; the kernel rounds each row's logit gradient (round_row) to bf16 into
// the first half of that row's fp32 storage, which the two backward products read with a row
// stride of 2V bf16 elements. No fp32 copy of any part of W is made.
struct OneDnnBf16Head {
  static constexpr bool kBf16Grad = true;
  const uint16_t* W;
  int64_t D, V;
  uint16_t* hc_bf16;  // [chunk, D]
  void logits(const float* hc, int64_t c, float* z) const;
  void grad_h(const float* z, int64_t c, float* dhc) const;
  void grad_w(const float* z, int64_t c, float* dW, bool accumulate) const;
  static void round_row(float* z_row, int64_t V) { round_row_to_bf16_in_place(z_row, V); }
  // Counted scratch for chunks of up to C rows: the rows in bf16 and the largest of oneDNN's
  // scratch pads for the three products.
  static int64_t scratch_bytes(int64_t C, int64_t D, int64_t V);
};

// A head formed a tile of rows at a time (Rows: QLoRA's NF4 head, or QAT's fake-quantized head)
// on the CPU's bf16 dot products, for an h that holds bf16 values: each tile is formed in fp32,
// rounded to bf16 (as nf4_bf16_matmul.h rounds NF4, and as an unfused bf16 graph rounds a
// fake-quantized weight) and multiplied into its columns of the logits, or summed into dh from
// its columns of the bf16 logit gradient (OneDnnBf16Head's layout). A trainable head's dW is
// dz^T h, which does not read W. A head is formed twice per chunk, as TiledHead's is.
template <class Rows>
struct OneDnnTiledHead {
  static constexpr bool kBf16Grad = true;
  Rows W;
  int64_t D, V, tile_rows;
  float* tile32;      // [tile_rows, D]
  uint16_t* tile16;   // [tile_rows, D]
  uint16_t* hc_bf16;  // [chunk, D]

  void logits(const float* hc, int64_t c, float* z) const {
    f32_to_bf16_array(hc, hc_bf16, c * D);
    for (int64_t v0 = 0; v0 < V; v0 += tile_rows) {
      const int64_t v1 = std::min(V, v0 + tile_rows);
      form_tile(v0, v1);
      matmul_bf16_onednn(false, true, c, v1 - v0, D, hc_bf16, tile16, z + v0, {.ldc = V});
    }
  }
  void grad_h(const float* z, int64_t c, float* dhc) const {
    for (int64_t v0 = 0; v0 < V; v0 += tile_rows) {
      const int64_t v1 = std::min(V, v0 + tile_rows);
      form_tile(v0, v1);
      matmul_bf16_onednn(false, false, c, D, v1 - v0, bf16_logit_grads(z) + v0, tile16, dhc,
                         {.lda = 2 * V, .accumulate = v0 > 0});
    }
  }
  void grad_w(const float* z, int64_t c, float* dW, bool accumulate) const {
    bf16_head_grad_w(z, hc_bf16, c, D, V, dW, accumulate);
  }
  static void round_row(float* z_row, int64_t n) { round_row_to_bf16_in_place(z_row, n); }

 private:
  void form_tile(int64_t v0, int64_t v1) const {
    W(v0, v1, tile32);
    f32_to_bf16_array(tile32, tile16, (v1 - v0) * D);
  }
};
using OneDnnNF4Head = OneDnnTiledHead<NF4Rows>;

// Counted scratch of a OneDnnTiledHead for chunks of up to C rows and tiles of tile_rows rows:
// both tiles, the chunk's rows in bf16, the largest of oneDNN's scratch pads.
int64_t onednn_tiled_head_scratch_bytes(int64_t C, int64_t D, int64_t V, int64_t tile_rows);

// Whether Head multiplies bf16 logit gradients (OneDnnBf16Head, OneDnnTiledHead): the kernels round
// each row of the chunk's gradient (or softmax) with Head::round_row before grad_h / grad_w.
template <class Head>
constexpr bool kBf16GradHead = requires {
  Head::kBf16Grad;
};

// The rows of [r0, r1) that have a label (-100: none), each checked against the vocabulary,
// into `rows`, and their hidden states copied into hc [rows.size(), D]. Returns the count.
template <class T>
int64_t gather_labelled_rows(const T* h, const int32_t* labels, int64_t r0, int64_t r1, int64_t D,
                             int64_t V, std::vector<int64_t>& rows, T* hc) {
  rows.clear();
  for (int64_t r = r0; r < r1; ++r) {
    const int32_t y = labels[r];
    if (y == -100) continue;
    FT_CHECK(y >= 0 && y < V, "label " + std::to_string(y) + " at token " + std::to_string(r) +
                                  " is outside the vocabulary [0, " + std::to_string(V) + ")");
    rows.push_back(r);
  }
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(hc + int64_t(i) * D, h + rows[i] * D, sizeof(T) * size_t(D));
  return int64_t(rows.size());
}

}  // namespace fusetune::kernels::detail
