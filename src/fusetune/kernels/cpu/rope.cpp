// Rotary position embedding, Hugging Face rotate-half convention: lanes i and i + Dh/2 form a
// pair rotated by angle positions[b,t] * inv_freq[i] (cos/sin tables precomputed per position).
#include <string>

#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/kernels/cpu/parallel.h"
#include "fusetune/util/error.h"

namespace fusetune::kernels {

void check_rope_positions(const int32_t* positions, int64_t n, int64_t max_pos) {
  for (int64_t i = 0; i < n; ++i) {
    FT_CHECK(positions[i] >= 0 && positions[i] < max_pos,
             "rope: position " + std::to_string(positions[i]) + " at index " + std::to_string(i) +
                 " is outside the rotary table [0, " + std::to_string(max_pos) + ")");
  }
}

template <class T>
void rope(const T* x, const T* cos, const T* sin, const int32_t* positions, T* out, int64_t B,
          int64_t Tn, int64_t H, int64_t Dh, bool inverse) {
  FT_CHECK(B >= 0 && Tn >= 0 && H >= 0 && Dh >= 2 && Dh % 2 == 0,
           "rope: head dim must be even and >= 2, got Dh=" + std::to_string(Dh));
  // The table length is not passed here; callers that know it use check_rope_positions.
  for (int64_t i = 0; i < B * Tn; ++i) {
    FT_CHECK(positions[i] >= 0, "rope: negative position " + std::to_string(positions[i]) +
                                    " at index " + std::to_string(i));
  }
  const int64_t half = Dh / 2;
  const T sign = inverse ? T(-1) : T(1);
#pragma omp parallel for schedule(static) if (B * Tn * H * Dh >= detail::kParallelMin)
  for (int64_t bt = 0; bt < B * Tn; ++bt) {
    const T* c = cos + static_cast<int64_t>(positions[bt]) * half;
    const T* s = sin + static_cast<int64_t>(positions[bt]) * half;
    for (int64_t h = 0; h < H; ++h) {
      const T* xr = x + (bt * H + h) * Dh;
      T* o = out + (bt * H + h) * Dh;
      // Each lane reads its pair before writing it, so out == x (in place) is fine.
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const T x1 = xr[i];
        const T x2 = xr[i + half];
        const T si = sign * s[i];
        o[i] = x1 * c[i] - x2 * si;
        o[i + half] = x2 * c[i] + x1 * si;
      }
    }
  }
}

template void rope<float>(const float*, const float*, const float*, const int32_t*, float*, int64_t,
                          int64_t, int64_t, int64_t, bool);
template void rope<double>(const double*, const double*, const double*, const int32_t*, double*,
                           int64_t, int64_t, int64_t, int64_t, bool);

}  // namespace fusetune::kernels
