#pragma once
// An NF4 weight (QLoRA's frozen base) multiplied on the CPU's bf16 dot products (oneDNN,
// bf16_matmul.h): each tile of nf4_tile_rows rows is dequantized and rounded to bf16, as
// bitsandbytes and torchao dequantize NF4 to the bf16 compute dtype, and multiplied with the
// activations in bf16, fp32 accumulation. Taken only where the bf16 path is oneDNN and the
// activations hold bf16 values (a bf16 graph's: holds_bf16_values), so rounding them is exact;
// otherwise the functions do nothing and return false (the caller's fp32 tiles run).
#include <cstdint>

#include "fusetune/kernels/cpu/nf4.h"

namespace fusetune::kernels {

// y [N, rows] = x [N, cols] W^T.
bool nf4_matmul_bf16(const NF4View& w, const float* x, int64_t N, float* y);

// dx [N, cols] = dy [N, rows] W.
bool nf4_matmul_backward_bf16(const NF4View& w, const float* dy, int64_t N, float* dx);

// Counted scratch of the two above for N rows of activations (the plans count it): the fp32
// and bf16 tiles, the activations in bf16, oneDNN's scratch pad.
int64_t nf4_matmul_bf16_scratch_bytes(int64_t N, int64_t rows, int64_t cols, bool backward);

}  // namespace fusetune::kernels
