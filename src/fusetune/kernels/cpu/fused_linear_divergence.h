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
// gradient), as torchtune runs it under no_grad. Dense heads, float or double.
#include <array>
#include <cstdint>

#include "fusetune/kernels/cpu/divergence.h"

namespace fusetune::kernels {

template <class T>
struct LinearDivergenceInputs {
  const T* h = nullptr;  // student hidden [N, D]
  const T* W = nullptr;  // student head [V, D]
  int64_t D = 0;
  const T* teacher_h = nullptr;  // teacher hidden [N, teacher_D]
  const T* teacher_W = nullptr;  // teacher head [V, teacher_D]
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
// hidden rows of both models and, with gradients, the chunk's dh.
int64_t fused_divergence_scratch_bytes(int64_t chunk_rows, int64_t D, int64_t teacher_D, int64_t V,
                                       int64_t elem_bytes, bool grads);

}  // namespace fusetune::kernels
