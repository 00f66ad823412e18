// Data movement: axis swap, GQA head repetition, slicing along one axis, and their backwards.
#include <cstring>
#include <string>

#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/kernels/cpu/parallel.h"
#include "fusetune/util/error.h"

namespace fusetune::kernels {

template <class T>
void transpose(const T* x, T* out, int64_t outer, int64_t d0, int64_t mid, int64_t d1,
               int64_t inner) {
  FT_CHECK(outer >= 0 && d0 >= 0 && mid >= 0 && d1 >= 0 && inner >= 0,
           "transpose: negative dimension");
  const int64_t total = outer * d0 * mid * d1 * inner;
  // Walk the output in order; each step copies one contiguous `inner` run of the input.
#pragma omp parallel for collapse(3) schedule(static) if (total >= detail::kParallelMin)
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t a1 = 0; a1 < d1; ++a1) {
      for (int64_t m = 0; m < mid; ++m) {
        T* dst = out + (((o * d1 + a1) * mid + m) * d0) * inner;
        for (int64_t a0 = 0; a0 < d0; ++a0) {
          const T* src = x + (((o * d0 + a0) * mid + m) * d1 + a1) * inner;
          if (inner == 1) {
            dst[a0] = src[0];
          } else {
            std::memcpy(dst + a0 * inner, src, sizeof(T) * inner);
          }
        }
      }
    }
  }
}

template <class T>
void repeat_heads(const T* x, T* out, int64_t outer, int64_t kv, int64_t groups, int64_t inner) {
  FT_CHECK(outer >= 0 && kv >= 0 && groups >= 1 && inner >= 0,
           "repeat_heads: bad shape (groups=" + std::to_string(groups) + ")");
  const int64_t heads = kv * groups;
#pragma omp parallel for schedule(static) if (outer * heads * inner >= detail::kParallelMin)
  for (int64_t oh = 0; oh < outer * heads; ++oh) {
    const int64_t o = oh / heads;
    const int64_t k = (oh % heads) / groups;
    std::memcpy(out + oh * inner, x + (o * kv + k) * inner, sizeof(T) * inner);
  }
}

template <class T>
void repeat_heads_backward(const T* dy, T* dx, int64_t outer, int64_t kv, int64_t groups,
                           int64_t inner) {
  FT_CHECK(outer >= 0 && kv >= 0 && groups >= 1 && inner >= 0,
           "repeat_heads_backward: bad shape (groups=" + std::to_string(groups) + ")");
  // Each dx row sums its `groups` dy rows in order g = 0, 1, ...: deterministic.
#pragma omp parallel for schedule(static) if (outer * kv * groups * inner >= detail::kParallelMin)
  for (int64_t ok = 0; ok < outer * kv; ++ok) {
    T* d = dx + ok * inner;
    const T* src = dy + ok * groups * inner;
    std::memcpy(d, src, sizeof(T) * inner);
    for (int64_t g = 1; g < groups; ++g) {
      const T* s = src + g * inner;
#pragma omp simd
      for (int64_t i = 0; i < inner; ++i) d[i] += s[i];
    }
  }
}

namespace {
void check_slice(const char* op, int64_t outer, int64_t len, int64_t inner, int64_t start,
                 int64_t n) {
  FT_CHECK(outer >= 0 && len >= 0 && inner >= 0, std::string(op) + ": negative dimension");
  FT_CHECK(start >= 0 && n >= 0 && start + n <= len,
           std::string(op) + ": range [" + std::to_string(start) + ", " +
               std::to_string(start + n) + ") is outside the axis of length " +
               std::to_string(len));
}
}  // namespace

template <class T>
void slice(const T* x, T* out, int64_t outer, int64_t len, int64_t inner, int64_t start,
           int64_t n) {
  check_slice("slice", outer, len, inner, start, n);
#pragma omp parallel for schedule(static) if (outer * n * inner >= detail::kParallelMin)
  for (int64_t o = 0; o < outer; ++o) {
    std::memcpy(out + o * n * inner, x + (o * len + start) * inner, sizeof(T) * n * inner);
  }
}

template <class T>
void slice_backward(const T* dy, T* dx, int64_t outer, int64_t len, int64_t inner, int64_t start,
                    int64_t n) {
  check_slice("slice_backward", outer, len, inner, start, n);
#pragma omp parallel for schedule(static) if (outer * len * inner >= detail::kParallelMin)
  for (int64_t o = 0; o < outer; ++o) {
    T* d = dx + o * len * inner;
    std::memset(d, 0, sizeof(T) * start * inner);
    std::memcpy(d + start * inner, dy + o * n * inner, sizeof(T) * n * inner);
    std::memset(d + (start + n) * inner, 0, sizeof(T) * (len - start - n) * inner);
  }
}

#define FT_INSTANTIATE(T)                                                                   \
  template void transpose<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t, int64_t);    \
  template void repeat_heads<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t);          \
  template void repeat_heads_backward<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t); \
  template void slice<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t, int64_t);        \
  template void slice_backward<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t, int64_t);
FT_INSTANTIATE(float)
FT_INSTANTIATE(double)
#undef FT_INSTANTIATE

}  // namespace fusetune::kernels
