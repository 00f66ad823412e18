#pragma once
// Fused LM head + cross-entropy (docs/design.md §3): loss and both gradients in one pass over the
// tokens, in chunks of `chunk_rows`, so only a [chunk_rows, V] scratch of logits ever exists.
//   z = h_c W^T;  loss += logsumexp(z) - z[label];  dz = (softmax(z) - onehot(label)) * scale
//   dh_c = dz W;  dW += dz^T h_c
// Rows whose label is -100 are skipped entirely (their dh is zero). Returns scale * sum of
// the per-token losses. h [N, D], W [V, D], dh [N, D], dW [V, D].
// softcap > 0 (Gemma 2's final_logit_softcapping): each chunk's z is first capped to
// softcap * tanh(z / softcap) (softcap_rows.h), and dz goes back through the cap.
#include <cstdint>

#include "fusetune/kernels/cpu/bf16_head_products.h"

#include "fusetune/kernels/cpu/fake_quant.h"
#include "fusetune/kernels/cpu/nf4.h"

namespace fusetune::kernels {

// dW == nullptr: W is frozen, no dW is computed (no [V, D] output, no third GEMM).
template <class T>
double fused_linear_cross_entropy(const T* h, const T* W, const int32_t* labels, T scale, int64_t N,
                                  int64_t D, int64_t V, int64_t chunk_rows, T* dh, T* dW,
                                  double softcap = 0.0);

// The same with a frozen NF4 head W [V, D] (QLoRA): per chunk, W is dequantized a tile of
// nf4_tile_rows(V, D) rows at a time into a small scratch inside both GEMMs (z = h_c W^T and
// dh_c = dz W), never as a whole fp32 copy. No dW. Where bf16 runs on the CPU's bf16 dot
// products and h holds bf16 values (below), each tile is rounded to bf16 and multiplied there.
template <class T>
double fused_nf4_linear_cross_entropy(const T* h, const NF4View& W, const int32_t* labels, T scale,
                                      int64_t N, int64_t chunk_rows, T* dh, double softcap = 0.0);

// The same with a bf16 head W [V, D] (dtype: bf16); h and the gradients are fp32, dW (optional)
// accumulates over the chunks in fp32. Where bf16 matmuls run on the CPU's bf16 dot products
// (bf16_matmul.h) and every h holds a bf16 value (a bf16 graph's hidden states, widened), the
// three products run there, each chunk's logit gradient rounded to bf16 as an unfused bf16
// graph rounds it; otherwise W is widened tile by tile like NF4.
double fused_bf16_linear_cross_entropy(const float* h, const uint16_t* W, const int32_t* labels,
                                       float scale, int64_t N, int64_t D, int64_t V,
                                       int64_t chunk_rows, float* dh, float* dW,
                                       double softcap = 0.0);

// The same with the head fake-quantized (QAT, fake_quant.h): fq(W) is formed a tile of
// fake_quant_tile_rows(V, D) rows at a time inside both GEMMs of each chunk, never whole. dW
// (optional) is the gradient w.r.t. fq(W), dz^T h: the straight-through estimator's (a
// scheme's mask is the graph's FakeQuantizeBackward, applied to this output).
template <class T>
double fused_fake_quant_linear_cross_entropy(const FakeQuantSpec& spec, const T* h, const T* W,
                                             const int32_t* labels, T scale, int64_t N, int64_t D,
                                             int64_t V, int64_t chunk_rows, T* dh, T* dW,
                                             double softcap = 0.0);
// ... with W stored bf16 (dtype: bf16): each tile widened, then fake-quantized (and, on bf16 dot
// products with an h that holds bf16 values, rounded to bf16 and multiplied there).
double fused_fake_quant_bf16_linear_cross_entropy(const FakeQuantSpec& spec, const float* h,
                                                  const uint16_t* W, const int32_t* labels,
                                                  float scale, int64_t N, int64_t D, int64_t V,
                                                  int64_t chunk_rows, float* dh, float* dW,
                                                  double softcap = 0.0);

// Chunk size that keeps the [chunk, V] scratch within `budget_bytes` (at least 16 rows).
int64_t fused_ce_chunk_rows(int64_t N, int64_t V, int64_t elem_bytes, int64_t budget_bytes);

// Bytes of scratch the kernels above allocate (counted tensors): the [C, V] logits block, the
// gathered hidden rows and their gradient [C, D] each, and for an NF4, bf16 or fake-quantized
// head (tiled) the widened tile, or on bf16 dot products (bf16) the larger of that tile and what
// they take there (bf16_head_products.h).
int64_t fused_ce_scratch_bytes(int64_t chunk_rows, int64_t D, int64_t V, int64_t elem_bytes,
                               bool tiled, Bf16HeadProducts bf16 = Bf16HeadProducts::None);

}  // namespace fusetune::kernels
