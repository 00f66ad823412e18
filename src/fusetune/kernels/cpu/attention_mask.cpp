// Causal (and same-document, for packed sequences; and sliding-window, Gemma 2) attention mask
// applied to scores [B, H, T, T]: masked entries become -inf so softmax gives them zero weight.
#include <algorithm>
#include <limits>
#include <string>

#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/kernels/cpu/parallel.h"
#include "fusetune/util/error.h"

namespace fusetune::kernels {
namespace {

// Calls keep(off, j0, j1) for each kept span and mask(off, j0, j1) for each masked span of
// every score row (off = offset of the row). Row i of (b, h) keeps keys j <= i with doc_ids[b, j]
// == doc_ids[b, i] and, with a window, i - j < window.
template <class Keep, class Mask>
void for_each_row(const int32_t* doc_ids, int64_t window, int64_t B, int64_t H, int64_t Tn,
                  Keep keep, Mask mask) {
  FT_CHECK(B >= 0 && H >= 0 && Tn >= 0, "causal_mask: negative shape B=" + std::to_string(B) +
                                            " H=" + std::to_string(H) + " T=" + std::to_string(Tn));
#pragma omp parallel for schedule(static) if (B * H * Tn * Tn >= detail::kParallelMin)
  for (int64_t row = 0; row < B * H * Tn; ++row) {
    const int64_t i = row % Tn;
    const int64_t b = row / (H * Tn);
    const int64_t off = row * Tn;
    const int64_t first = window > 0 ? std::max<int64_t>(0, i - window + 1) : 0;
    mask(off, 0, first);
    if (doc_ids == nullptr) {
      keep(off, first, i + 1);
    } else {
      const int32_t* doc = doc_ids + b * Tn;
      const int32_t di = doc[i];
      // Runs of equal keep/mask decisions (packed documents are contiguous, so runs are long).
      for (int64_t j = first; j <= i;) {
        const bool same = doc[j] == di;
        int64_t j1 = j + 1;
        while (j1 <= i && (doc[j1] == di) == same) ++j1;
        if (same) {
          keep(off, j, j1);
        } else {
          mask(off, j, j1);
        }
        j = j1;
      }
    }
    mask(off, i + 1, Tn);
  }
}

}  // namespace

template <class T>
void causal_mask(const T* scores, const int32_t* doc_ids, T* out, int64_t B, int64_t H, int64_t Tn,
                 int64_t window) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  for_each_row(
      doc_ids, window, B, H, Tn,
      [=](int64_t off, int64_t j0, int64_t j1) {
#pragma omp simd
        for (int64_t j = j0; j < j1; ++j) out[off + j] = scores[off + j];
      },
      [=](int64_t off, int64_t j0, int64_t j1) {
#pragma omp simd
        for (int64_t j = j0; j < j1; ++j) out[off + j] = kNegInf;
      });
}

template <class T>
void causal_mask_backward(const T* dy, const int32_t* doc_ids, T* dx, int64_t B, int64_t H,
                          int64_t Tn, int64_t window) {
  for_each_row(
      doc_ids, window, B, H, Tn,
      [=](int64_t off, int64_t j0, int64_t j1) {
#pragma omp simd
        for (int64_t j = j0; j < j1; ++j) dx[off + j] = dy[off + j];
      },
      [=](int64_t off, int64_t j0, int64_t j1) {
#pragma omp simd
        for (int64_t j = j0; j < j1; ++j) dx[off + j] = T(0);
      });
}

template void causal_mask<float>(const float*, const int32_t*, float*, int64_t, int64_t, int64_t,
                                 int64_t);
template void causal_mask<double>(const double*, const int32_t*, double*, int64_t, int64_t, int64_t,
                                  int64_t);
template void causal_mask_backward<float>(const float*, const int32_t*, float*, int64_t, int64_t,
                                          int64_t, int64_t);
template void causal_mask_backward<double>(const double*, const int32_t*, double*, int64_t, int64_t,
                                           int64_t, int64_t);

}  // namespace fusetune::kernels
