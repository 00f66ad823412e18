#pragma once
// Gemma 2's final-logit soft-cap inside the fused LM-head kernels (fused_linear_cross_entropy,
// fused_linear_log_probs): each chunk's logits are capped in place, computed exactly as the
// Softcap op and its backward compute them, so a fused head matches the eager Softcap.
#include <cmath>
#include <cstdint>

namespace fusetune::kernels::detail {

// z := cap tanh(z / cap) over n logits.
template <class T>
inline void softcap_row(T* z, int64_t n, T cap) {
  const T inv = T(1) / cap;
  for (int64_t j = 0; j < n; ++j) z[j] = std::tanh(z[j] * inv) * cap;
}

// The cap's derivative at a capped logit zc: 1 - (zc / cap)^2 (SoftcapBackward's).
template <class T>
inline T softcap_slope(T zc, T cap) {
  const T t = zc * (T(1) / cap);
  return T(1) - t * t;
}

}  // namespace fusetune::kernels::detail
