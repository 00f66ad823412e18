#pragma once
// Matmuls of bf16 operands on the CPU's bf16 dot products (AVX512_BF16, AMX-BF16) through
// oneDNN, fp32 accumulation; elsewhere the widening path (bf16.h: operands widened to fp32 for
// OpenBLAS). The choice is made at run time, per call, from what the CPU reports and the
// environment variable FUSETUNE_BF16_MATMUL (docs/design.md §6):
//   auto      (or unset) oneDNN where the CPU multiplies bf16 natively, else widening;
//   widening  always widen (tests reach both paths on one machine; the old numerics);
//   onednn    always oneDNN; an error where the CPU has no bf16 dot products.
#include <cstdint>
#include <string>

#include "fusetune/core/tensor.h"

namespace fusetune::kernels {

enum class Bf16MatmulPath { Widening, OneDnn };

// The path a bf16 matmul takes now. Throws on a FUSETUNE_BF16_MATMUL value other than the
// three above, naming the variable and the values it takes.
Bf16MatmulPath bf16_matmul_path();

// True where the CPU (as oneDNN sees it, DNNL_MAX_CPU_ISA included) has bf16 dot products.
bool cpu_has_bf16_dot_products();

// One line for the run header and `fusetune plan`: the path and why, e.g.
// "oneDNN 2.6.3 (avx512_core_bf16), fp32 accumulation: matmuls, fused LM heads, NF4 and
// fake-quantized tiles" or
// "widening to fp32 for OpenBLAS (FUSETUNE_BF16_MATMUL=widening)".
std::string bf16_matmul_description();

// C [M, N] = op(A) op(B) through oneDNN: A stored [M, K] ([K, M] when trans_a), B stored
// [K, N] ([N, K] when trans_b), both bf16 and contiguous; products summed in fp32; C fp32, or
// bf16 (c_bf16) rounded once to nearest even. oneDNN's scratch is a counted tensor.
void matmul_bf16_onednn(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                        const uint16_t* A, const uint16_t* B, void* C, bool c_bf16);

// Row strides (0: the operand's own row length) of a product's stored A, B and C, and whether C
// accumulates (C += op(A) op(B)). The fused LM heads use them: their bf16 logit gradients sit in
// the first half of each fp32 logit row (lda = 2 V), the head gradient sums over the chunks, and
// an NF4 weight's tile of rows writes its columns of the output (ldc = the output's width).
struct Bf16MatmulLayout {
  int64_t lda = 0, ldb = 0, ldc = 0;
  bool accumulate = false;
};

// The same with an fp32 C and a layout.
void matmul_bf16_onednn(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                        const uint16_t* A, const uint16_t* B, float* C,
                        const Bf16MatmulLayout& layout);

// Bytes of the counted scratch oneDNN takes for that product (the plans count it).
int64_t matmul_bf16_onednn_scratch_bytes(bool trans_a, bool trans_b, int64_t M, int64_t N,
                                         int64_t K, const Bf16MatmulLayout& layout);

// The runtime's entry for an unbatched matmul node of two bf16 operands (leading dimensions
// all 1): a decode step's x W^T runs through decode_gemv_bf16_amx on the oneDNN path where
// the CPU has AMX tiles (kDecodeAmxMinRows to kDecodeGemvMaxRows rows of x), else through
// decode_gemv_bf16_weight (at most kDecodeGemvRowsBeforeOneDnn rows on the oneDNN path,
// kDecodeGemvMaxRows on the widening one); anything else through oneDNN when the path is
// oneDNN. Returns true when it ran, otherwise does nothing and returns false (the caller widens).
bool matmul_bf16_native(bool trans_a, bool trans_b, const Tensor& a, const Tensor& b, Tensor& c);

}  // namespace fusetune::kernels
