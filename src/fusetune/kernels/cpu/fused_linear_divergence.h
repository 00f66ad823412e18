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
#include <array>
#include <cstdint>

#include "fusetune/kernels/cpu/divergence.h"

namespace fusetune::kernels {

template <class T>
struct LinearDivergenceInputs {
  const T* h = nullptr;              // student hidden [N, D]
  const T* W = nullptr;              // student head [V, D]
  const uint16_t* W_bf16 = nullptr;  // or that head in bf16 (T = float only)
  int64_t D = 0;
  const T* teacher_h = nullptr;              // teacher hidden [N, teacher_D]
  const T* teacher_W = nullptr;              // teacher head [V, teacher_D]
  const uint16_t* teacher_W_bf16 = nullptr;  // or that head in bf16 (T = float only)
  int64_t teacher_D = 0;
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
};

// Returns {ce_sum, kd_sum}; grads == nullptr: forward only.
template <class T>
std::array<double, 2> fused_linear_divergence(const LinearDivergenceInputs<T>& in,
                                              const LinearDivergenceGrads<T>* grads);

// Bytes of the counted scratch the kernel allocates: both [C, V] logits blocks, the gathered
// hidden rows of both models, with gradients the chunk's dh, and a widened tile of each bf16
// head.
struct DivergenceScratchShape {
  int64_t chunk_rows = 1, D = 0, teacher_D = 0, V = 0, elem_bytes = 4;
  bool grads = false, student_bf16 = false, teacher_bf16 = false;
};
int64_t fused_divergence_scratch_bytes(const DivergenceScratchShape& s);

}  // namespace fusetune::kernels
