#pragma once
// Decode-time products with a bf16 or NF4 weight: y [M, N] = x [M, K] W^T for the few rows a
// decode step carries (M = the batch, one new token per row), W stored [N, K] (docs/design.md §9).
// A decode step is bound by reading the weights, so this reads W once, in its stored type:
// each thread takes a block of W's rows and widens a short piece of each row at a time in
// registers, reused by every row of x. No widened copy of W exists (the widening path widens
// 16 MiB tiles, and oneDNN's bf16 GEMM packs W again for M = 1: both cost more than the read).
// fp32 accumulation; each output is one thread's fixed-order sum, so results do not depend on
// the thread count.
#include <cstdint>

#include "fusetune/kernels/cpu/nf4.h"

namespace fusetune::kernels {

// The most rows of x this kernel is for; larger M is a GEMM (the GEMM paths are faster there).
inline constexpr int64_t kDecodeGemvMaxRows = 16;
// Where the CPU has bf16 dot products, oneDNN's bf16 GEMM overtakes this kernel above 4 rows
// (bench_gemm --decode: at 8 rows it reads the weight 1.3-2x faster on one thread, the same
// on two; at 1 row this kernel is 2-4x faster).
inline constexpr int64_t kDecodeGemvRowsBeforeOneDnn = 4;
// Where the CPU also has AMX tiles, decode_gemv_bf16_amx takes 4 to kDecodeGemvMaxRows rows:
// it reads the weight 1.1-1.6x faster than oneDNN at 8 rows on two threads and than the loop
// above at 4; at 1 row the loop is as fast or faster (bench_gemm --decode).
inline constexpr int64_t kDecodeAmxMinRows = 4;

// x fp32 [M, K] or bf16 (x_bf16); y fp32 [M, N] or bf16 rounded once (y_bf16). M <=
// kDecodeGemvMaxRows.
void decode_gemv_bf16_weight(int64_t M, int64_t N, int64_t K, const void* x, bool x_bf16,
                             const uint16_t* w, void* y, bool y_bf16);

// Whether this CPU has AMX tiles for bf16 (AMX-TILE, AMX-BF16) and Linux lets the process use
// them (it asks once).
bool amx_tiles_usable();

// The same product with x bf16 too, on AMX tiles: y^T = W x^T with W read as stored, 16 of its
// rows per tile, so the weight streams once at memory speed for any M up to
// kDecodeGemvMaxRows (oneDNN packs W first; the loop above runs out of FMA issue past ~4 rows).
// Only where amx_tiles_usable(). Each output's sum depends on neither the thread count nor M
// (which rows share the batch). y fp32 or bf16 rounded once.
void decode_gemv_bf16_amx(int64_t M, int64_t N, int64_t K, const uint16_t* x, const uint16_t* w,
                          void* y, bool y_bf16);

// y [M, rows] = x [M, cols] W^T for an NF4 weight (QLoRA's frozen base): each 16-element piece
// is dequantized in registers (the 16-value table is one AVX-512 register) and used at once;
// the weight values are exactly nf4_dequantize_rows'. Returns false, doing nothing, where it
// does not apply (cols not a multiple of 16, or M > kDecodeGemvMaxRows): the caller's tiled GEMM.
bool decode_gemv_nf4_weight(int64_t M, const NF4View& w, const float* x, float* y);

}  // namespace fusetune::kernels
