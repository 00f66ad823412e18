#pragma once
// Row-wise divergences between a student's and a teacher's next-token distributions, from
// their logits (knowledge distillation, losses/distillation.h). With z the logits, T the
// temperature, q = softmax(z_student / T), p = softmax(z_teacher / T):
//   ForwardKL       -sum_v p log q       torchtune's ForwardKLLoss: the cross-entropy of the
//                                        student under the teacher (KL(p||q) without the
//                                        teacher's entropy, a constant; the same gradient)
//   ReverseKL       sum_v q (log q - log p)                   torchtune's ReverseKLLoss
//   GeneralizedJSD  beta KL(p||m) + (1 - beta) KL(q||m), m = beta p + (1 - beta) q  (TRL's
//                   GKD); beta = 0 is KL(p||q), beta = 1 is KL(q||p), as TRL special-cases them
// Rows whose label is -100 count 0 and get a zero gradient. Only the student is
// differentiated: the teacher is a constant (torchtune runs it under no_grad). Raw pointers,
// instantiated for float and double; sums in double.
#include <cstdint>

namespace fusetune::kernels {

enum class DivergenceKind : int { ForwardKL = 0, ReverseKL = 1, GeneralizedJSD = 2 };

struct DivergenceParams {
  DivergenceKind kind = DivergenceKind::ForwardKL;
  double beta = 0.5;         // GeneralizedJSD
  double temperature = 1.0;  // divides both models' logits
};

// One row of V logits of each model: returns the divergence; when `ds` is not null, writes
// d(divergence)/d(student logits) * grad_scale into ds[0..V) (ds may be `student` or
// `teacher` itself: each logit is read before its slot is written).
template <class T>
double divergence_row(const T* student, const T* teacher, int64_t V, const DivergenceParams& p,
                      T* ds = nullptr, double grad_scale = 1.0);

// The sum over rows whose label is not -100; student, teacher [N, V].
template <class T>
double divergence_sum(const T* student, const T* teacher, const int32_t* labels, int64_t N,
                      int64_t V, const DivergenceParams& p);

// dstudent [N, V] = dloss * d(divergence_sum)/d(student); zero on ignored rows.
template <class T>
void divergence_backward(T dloss, const T* student, const T* teacher, const int32_t* labels,
                         T* dstudent, int64_t N, int64_t V, const DivergenceParams& p);

}  // namespace fusetune::kernels
