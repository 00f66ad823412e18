#pragma once
// bf16 <-> fp32 for whole arrays and row tiles. bf16 is a storage format here: kernels compute
// in fp32, so bf16 values are widened on the way in and rounded (to nearest even) on the way
// out. Widening is exact (bf16 is the top half of an fp32); both loops are OpenMP-parallel and
// written so the compiler vectorizes them.
#include <cstdint>
#include <vector>

namespace fusetune::kernels {

void bf16_to_f32_array(const uint16_t* x, float* out, int64_t n);
void f32_to_bf16_array(const float* x, uint16_t* out, int64_t n);

// Whether every x[i] is a bf16 value (its low 16 bits zero), so rounding x to bf16 is exact: a
// bf16 graph's activations and gradients, widened. The kernels that multiply on the CPU's bf16
// dot products (bf16_matmul.h) take an fp32 operand only when this holds.
bool holds_bf16_values(const float* x, int64_t n);

// Rows of a bf16 weight [rows, cols] widened per tile in the tiled GEMMs: max(256 rows, 1 MiB
// of fp32), at most all rows. The tile is the only fp32 copy of any part of the weight; at
// least 256 rows keep each GEMM efficient where rows are long (dX = dY W sums over the tile's
// rows: NF4's 64-row minimum made the matmuls of a bf16 Llama 3.2 1B LoRA step 25% slower
// than fp32's, 256 rows 15%, measured with FUSETUNE_PROFILE).
int64_t bf16_tile_rows(int64_t rows, int64_t cols);

// Rows of the tile gemm_bf16_weight widens B in. With trans_b (y = x W^T) a tile of W's rows
// is a slice of the output's columns, and every slice is one GEMM call that packs all of A
// again: max(512 rows, 16 MiB of fp32), at most all rows (256-row slices made a Llama 3.2 1B
// layer's x W^T 10-24% slower than fp32's single sgemm, 16 MiB 1-8%: bench_gemm --bf16).
// Otherwise (dx = dy W) a tile is a slice of the summed dimension and A is read once either
// way: bf16_tile_rows.
int64_t bf16_weight_tile_rows(bool trans_b, int64_t rows, int64_t cols);

// out [M, N] fp32 = A [M, K] fp32 op(B), B bf16 stored [N, K] (trans_b) or [K, N], widened a
// tile of B's stored rows at a time (bf16_weight_tile_rows) into `tile` (that many rows of B's
// stored row length), or, when `tile` is null, into a counted scratch tile. A decode step's
// x W^T (trans_b, M <= kDecodeGemvMaxRows) widens nothing: decode_gemv.h.
void gemm_bf16_weight(bool trans_b, int64_t M, int64_t N, int64_t K, const float* A,
                      const uint16_t* B, float* out, float* tile = nullptr);

// The embedding backward into a bf16 table gradient dtable [V, D]: each id's rows of dy [n, D]
// summed in fp32 in position order (the fp32 kernel's order, so the result is its sum rounded
// once), written as bf16; every other row zero. No fp32 [V, D] buffer: the vocabulary is most
// of a small model's weights (128256 x 2048 for Llama 3.2 1B: 1 GB in fp32).
// `clear_rows`: as embedding_backward's (kernels.h).
void embedding_backward_bf16(const float* dy, const int32_t* ids, uint16_t* dtable, int64_t n,
                             int64_t D, int64_t V,
                             const std::vector<int32_t>* clear_rows = nullptr);

}  // namespace fusetune::kernels
