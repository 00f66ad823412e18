#pragma once
// AdamW's arithmetic, shared by the optimizers that keep its moments in fp32 (adamw.cpp) and
// in 8 bits (adamw8bit.cpp), so that both update a parameter with exactly the same
// expressions, in the same order, as torch.optim.AdamW (decoupled weight decay, lerp for the
// first moment, bias corrections folded into the step size and the denominator).
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "fusetune/optim/adamw.h"

namespace fusetune::adamw_math {

// Per parameter and step, in double.
struct Coefficients {
  double decay;  // 1 - lr * weight_decay
  double beta1, beta2;
  double step_size;  // lr / bias_correction1
  double bc2_sqrt;   // sqrt(bias_correction2)
  double eps;
};

// The coefficients of step `step` (1-based) at learning rate lr.
inline Coefficients coefficients(const AdamWOptions& o, double lr, int64_t step) {
  const double bc1 = 1 - std::pow(o.beta1, double(step));
  const double bc2 = 1 - std::pow(o.beta2, double(step));
  return {1 - lr * o.weight_decay, o.beta1, o.beta2, lr / bc1, std::sqrt(bc2), o.eps};
}

// The coefficients in T, each rounded once, as torch does when a Python float meets a tensor.
template <class T>
struct Update {
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  T decay, w, one_minus_w, b2, one_minus_b2, neg_step, bc2, eps;
  Bits from_m_mask;  // all ones when |w| < 0.5 (lerp from m), else zero (lerp from g)
  explicit Update(const Coefficients& c)
      : decay(T(c.decay)),
        w(T(1 - c.beta1)),  // lerp weight
        one_minus_w(T(1) - w),
        b2(T(c.beta2)),
        one_minus_b2(T(1 - c.beta2)),
        neg_step(T(-c.step_size)),
        bc2(T(c.bc2_sqrt)),
        eps(T(c.eps)),
        from_m_mask(std::abs(w) < T(0.5) ? ~Bits(0) : Bits(0)) {}

  // One element: the parameter p, its gradient g and its moments m, v (updated in place).
  void operator()(T& p, T g, T& m, T& v) const {
    const T pi = p * decay;
    // at::lerp picks the formula by weight size, for accuracy near both ends. Both are computed
    // and one kept by a bit mask: a branch here (FP ops may trap, so GCC will not if-convert
    // it) keeps the element loops of a bf16 update from vectorizing.
    const T from_m = m + w * (g - m), from_g = g - (g - m) * one_minus_w;
    const Bits mi_bits =
        (std::bit_cast<Bits>(from_m) & from_m_mask) | (std::bit_cast<Bits>(from_g) & ~from_m_mask);
    const T mi = std::bit_cast<T>(mi_bits);
    const T vi = v * b2 + one_minus_b2 * g * g;
    const T denom = std::sqrt(vi) / bc2 + eps;
    m = mi;
    v = vi;
    p = pi + neg_step * mi / denom;
  }
};

}  // namespace fusetune::adamw_math
