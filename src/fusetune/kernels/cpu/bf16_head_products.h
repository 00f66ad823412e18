#pragma once
// How a fused LM head's products run (fused_linear_cross_entropy.h, fused_linear_log_probs.h),
// for the scratch they take: in fp32 (a dense head, or a bf16 / NF4 / fake-quantized head
// widened tile by tile), or on the CPU's bf16 dot products (bf16_matmul.h) with a bf16 head, or
// an NF4 or fake-quantized head whose tiles are rounded to bf16 (head_gemm.h: OneDnnBf16Head,
// OneDnnTiledHead).
#include <cstdint>

namespace fusetune::kernels {

enum class Bf16HeadProducts { None, Bf16Weight, NF4Weight, FakeQuantWeight };

// Counted scratch of a head on bf16 dot products for chunks of up to C rows, beyond the logits
// block and the gathered rows (None: 0). The kernels fall back to the fp32 tile for an h that
// does not hold bf16 values; the plans take the larger of the two.
int64_t bf16_head_products_scratch_bytes(Bf16HeadProducts kind, int64_t C, int64_t D, int64_t V);

}  // namespace fusetune::kernels
