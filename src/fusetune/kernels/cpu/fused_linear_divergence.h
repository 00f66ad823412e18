#pragma once
// Knowledge distillation fused with both LM heads (docs/design.md §3, §7): the student's
// cross-entropy and its divergence from the teacher (divergence.h), summed over the tokens
// whose label is not -100, and their gradients w.r.t. the student's hidden states and head,
// chunk by chunk over the tokens. Per chunk of c labelled rows:
//   zs = hs_c Ws^T, zt = ht_c Wt^T                          (two [c, V] scratch blocks)
//   ce += lse(zs) - zs[y];  kd += divergence(zs, zt)
//   dz = dce (softmax(zs) - onehot(y)) + dkd d(divergence)/dzs
//   dh_c = dz Ws;  dWs += dz^T hs_c
// so no [tokens x vocab] tensor of either model exists. The teacher is a constant (no
// gradient), as torchtune runs it under no_grad. Dense heads, float or double; in float either
// head may instead be bf16 (a `dtype: bf16` run), widened a tile of rows at a time inside the
// chunk's GEMMs as the fused cross-entropy does (head_gemm.h): no fp32 copy of a whole head.
// The student's head may also be NF4 (QLoRA), dequantized a tile of rows at a time, and may
// carry a LoRA term (LoRA on lm_head):
//   zs = hs_c W^T + (hs_c A^T) Bs^T          (Bs = scale * B, [V, r]; A [r, D])
//   dA += (dz Bs)^T hs_c,  dBs += dz^T (hs_c A^T),  dh_c += (dz Bs) A
// chunk by chunk, so the low-rank gradients need no [tokens x vocab] tensor either. The LoRA
// term may read its own input x instead of hs (lora_dropout: x = dropout(h), the mask drawn
// outside the kernel), and a DoRA head scales each vocabulary column of the student's logits
// by c = magnitude / ||W + s B A||_row (computed outside the kernel):
//   zs = (hs_c W^T + (x_c A^T) Bs^T) diag(c)
//   dc += sum_rows dz (zs before scaling),  then dz := dz diag(c) for the rest
//   dx_c = (dz Bs) A (instead of adding it to dh_c),  dA += (dz Bs)^T x_c
#include <array>
#include <cstdint>

#include "fusetune/kernels/cpu/divergence.h"
#include "fusetune/kernels/cpu/nf4.h"

namespace fusetune::kernels {

template <class T>
struct LinearDivergenceInputs {
  const T* h = nullptr;              // student hidden [N, D]
  const T* W = nullptr;              // student head [V, D]
  const uint16_t* W_bf16 = nullptr;  // or that head in bf16 (T = float only)
  const NF4View* W_nf4 = nullptr;    // or that head in NF4 (frozen), [V, D]
  int64_t D = 0;
  // The student head's LoRA term (both null: none): A [r, D] and scale * B [V, r].
  const T* lora_A = nullptr;
  const T* lora_B = nullptr;
  int64_t lora_rank = 0;
  const T* lora_x = nullptr;                 // [N, D] the LoRA term's input (lora_dropout); null: h
  const T* col_scale = nullptr;              // [V] DoRA's per-column scale of the student's logits
  const T* teacher_h = nullptr;              // teacher hidden [N, teacher_D]
  const T* teacher_W = nullptr;              // teacher head [V, teacher_D]
  const uint16_t* teacher_W_bf16 = nullptr;  // or that head in bf16 (T = float only)
  int64_t teacher_D = 0;
  // Or the teacher as its top-k (teacher_top_k > 0; teacher_h and teacher_W unused): per row
  // the ids [N, K] of its K most probable tokens and their log-probabilities [N, K] at
  // temperature 1. Each chunk's teacher logits are these log-probs on the ids and
  // kTopKFloorLogit elsewhere, so the divergence sees the teacher's distribution restricted to
  // its top-k and renormalized (after the temperature): docs/distillation.md.
  const int32_t* teacher_topk_ids = nullptr;
  const T* teacher_topk_logprobs = nullptr;
  int64_t teacher_top_k = 0;
  const int32_t* labels = nullptr;  // [N], -100: ignored
  int64_t N = 0, V = 0;
  int64_t chunk_rows = 1;
  DivergenceParams divergence;
};

// The gradient of dce * ce_sum + dkd * kd_sum. dW == nullptr: the student's head is frozen
// (LoRA), no dW and no third GEMM.
template <class T>
struct LinearDivergenceGrads {
  double dce = 0, dkd = 0;
  T* dh = nullptr;  // [N, D], zero on ignored rows
  T* dW = nullptr;  // [V, D] or nullptr
  T* dA = nullptr;  // [r, D] and [V, r]: the LoRA term's gradients (with lora_A)
  T* dB = nullptr;
  T* d_lora_x = nullptr;     // [N, D] with lora_x: its gradient (then not in dh)
  T* d_col_scale = nullptr;  // [V] with col_scale
};

// Returns {ce_sum, kd_sum}; grads == nullptr: forward only.
template <class T>
std::array<double, 2> fused_linear_divergence(const LinearDivergenceInputs<T>& in,
                                              const LinearDivergenceGrads<T>* grads);

// The logit standing in for the tokens outside a row's top-k: probability 0 at any
// temperature, without the NaN an infinite logit gives (0 * inf).
inline constexpr double kTopKFloorLogit = -1e30;

// z [V] := the row's top-k log-probs at their ids, kTopKFloorLogit elsewhere.
template <class T>
void scatter_top_k(const int32_t* ids, const T* logprobs, int64_t K, int64_t V, T* z);

// The teacher's top-k for N rows of its final hidden states h [N, D] and head W [V, D] (dense,
// or W_bf16 when T = float): per row the ids of the K largest logits (ties: the lower id
// first), in that order, into ids [N, K], and their log-probabilities log softmax(z) into
// logprobs [N, K]. Chunks of chunk_rows rows: only a [chunk, V] block of logits exists.
// softcap > 0 (Gemma 2's final_logit_softcapping): the teacher's logits are
// softcap * tanh(z / softcap); its top-k are those of z (tanh is increasing, and ranking the
// uncapped logits keeps ties that the cap's rounding would make from reordering them), and
// its log-probs those of the capped distribution.
template <class T>
void teacher_top_k(const T* h, const T* W, const uint16_t* W_bf16, int64_t N, int64_t D, int64_t V,
                   int64_t K, int64_t chunk_rows, int32_t* ids, T* logprobs, double softcap = 0);

// Bytes of the counted scratch the kernel allocates: both [C, V] logits blocks, the gathered
// hidden rows of both models, with gradients the chunk's dh, a widened tile of each bf16 or
// NF4 head, the LoRA term's two [C, r] products, its own input's rows (and their gradient),
// and with DoRA's scale and gradients the chunk's unscaled logits.
struct DivergenceScratchShape {
  int64_t chunk_rows = 1, D = 0, teacher_D = 0, V = 0, elem_bytes = 4, lora_rank = 0;
  bool grads = false, student_bf16 = false, teacher_bf16 = false, student_nf4 = false;
  bool lora_x = false, col_scale = false;  // the LoRA term's own input, DoRA's column scale
};
int64_t fused_divergence_scratch_bytes(const DivergenceScratchShape& s);

}  // namespace fusetune::kernels
