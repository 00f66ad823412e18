#include "fusetune/kernels/cpu/fake_quant.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "fusetune/core/dtype.h"
#include "fusetune/core/tensor.h"
#include "fusetune/kernels/cpu/bf16.h"
#include "fusetune/kernels/cpu/ggml_quant.h"
#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/util/error.h"

namespace fusetune::kernels {
namespace {

constexpr double kF32Eps = double(std::numeric_limits<float>::epsilon());

// torch.round: half to even (the default rounding mode).
template <class T>
T round_even(T v) {
  return std::nearbyint(v);
}

float to_bf16(float v) { return bf16_to_f32(f32_to_bf16(v)); }

// One group of n elements: y = fq(x); mask (when not null) = whether the unclamped q was in
// range. y may be x.
template <class T>
void group_int4_symmetric(const T* x, T* y, int64_t n, bool* mask) {
  T lo = 0, hi = 0;
  for (int64_t i = 0; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  const T s = std::max(std::max(-lo, hi) / T(7.5), T(kF32Eps));
  const T inv = T(1) / s;
  for (int64_t i = 0; i < n; ++i) {
    const T q = round_even(x[i] * inv);
    if (mask) mask[i] = q >= T(-8) && q <= T(7);
    y[i] = std::clamp(q, T(-8), T(7)) * s;
  }
}

template <class T>
void group_uint4_asymmetric(const T* x, T* y, int64_t n, bool* mask) {
  T lo = x[0], hi = x[0];
  for (int64_t i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  const T s_full = std::max(hi - lo, T(1e-6)) / T(15);
  const T z_full = lo + s_full * T(8);
  // scales_precision bf16: scale and zero rounded; torchao's min_val = zero - 8 * scale is
  // bf16 arithmetic (rounded again).
  const T s = T(to_bf16(float(s_full))), z = T(to_bf16(float(z_full)));
  const T min_val = T(to_bf16(float(z - s * T(8))));
  for (int64_t i = 0; i < n; ++i) {
    const T q = round_even((x[i] - min_val) / s);
    if (mask) mask[i] = q >= T(0) && q <= T(15);
    y[i] = (std::clamp(q, T(0), T(15)) - T(8)) * s + z;
  }
}

template <class T>
void group_int8_per_token(const T* x, T* y, int64_t n, bool* mask) {
  T lo = 0, hi = 0;
  for (int64_t i = 0; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  const T s = std::max((hi - lo) / T(255), T(kF32Eps));
  const T zp = std::clamp(T(-128) - round_even(lo / s), T(-128), T(127));
  const T inv = T(1) / s;
  for (int64_t i = 0; i < n; ++i) {
    const T q = round_even(x[i] * inv) + zp;
    if (mask) mask[i] = q >= T(-128) && q <= T(127);
    y[i] = (std::clamp(q, T(-128), T(127)) - zp) * s;
  }
}

// ggml's reference rounding (ggml_quant.h), which takes float: double rounds through fp32.
bool is_gguf(FakeQuant scheme) {
  return scheme == FakeQuant::GgufQ4_0 || scheme == FakeQuant::GgufQ8_0 ||
         scheme == FakeQuant::GgufQ6_K || scheme == FakeQuant::GgufQ8_K;
}

int64_t gguf_block(FakeQuant scheme) {
  return scheme == FakeQuant::GgufQ6_K || scheme == FakeQuant::GgufQ8_K ? ggml::kBlockK
                                                                        : ggml::kBlock;
}

template <class T>
void group_gguf(FakeQuant scheme, const T* x, T* y, int64_t n, bool* mask) {
  auto fq = scheme == FakeQuant::GgufQ4_0   ? ggml::fake_quantize_row_q4_0
            : scheme == FakeQuant::GgufQ8_0 ? ggml::fake_quantize_row_q8_0
            : scheme == FakeQuant::GgufQ6_K ? ggml::fake_quantize_row_q6_K
                                            : ggml::fake_quantize_row_q8_K;
  if constexpr (std::is_same_v<T, float>) {
    fq(x, y, n);
  } else {
    const int64_t block = gguf_block(scheme);
    float buf[ggml::kBlockK];
    for (int64_t b = 0; b < n; b += block) {
      for (int64_t i = 0; i < block; ++i) buf[i] = float(x[b + i]);
      fq(buf, buf, block);
      for (int64_t i = 0; i < block; ++i) y[b + i] = T(buf[i]);
    }
  }
  if (mask) std::fill(mask, mask + n, true);
}

template <class T>
void fq_group(FakeQuant scheme, const T* x, T* y, int64_t n, bool* mask) {
  switch (scheme) {
    case FakeQuant::GgufQ4_0:
    case FakeQuant::GgufQ8_0:
    case FakeQuant::GgufQ6_K:
    case FakeQuant::GgufQ8_K:
      return group_gguf(scheme, x, y, n, mask);
    case FakeQuant::Int4Symmetric:
      return group_int4_symmetric(x, y, n, mask);
    case FakeQuant::Uint4Asymmetric:
      return group_uint4_asymmetric(x, y, n, mask);
    case FakeQuant::Int8PerToken:
      return group_int8_per_token(x, y, n, mask);
    default:
      throw Error(std::string("fake quantization: scheme ") + fake_quant_name(scheme) +
                  " is not implemented");
  }
}

void check_spec(const FakeQuantSpec& spec, int64_t cols) {
  FT_CHECK(spec.group > 0 && cols % spec.group == 0,
           std::string("fake quantization (") + fake_quant_name(spec.scheme) + "): rows of " +
               std::to_string(cols) + " elements are not a whole number of groups of " +
               std::to_string(spec.group));
  FT_CHECK(!is_gguf(spec.scheme) || spec.group % gguf_block(spec.scheme) == 0,
           std::string("fake quantization (") + fake_quant_name(spec.scheme) +
               "): groups must be whole blocks of " + std::to_string(gguf_block(spec.scheme)));
}

// Row r of the result: fq of x's row r (x may be a tile's own storage).
template <class T>
void fq_row(const FakeQuantSpec& spec, const T* x, T* y, int64_t cols, bool* mask) {
  for (int64_t c = 0; c < cols; c += spec.group)
    fq_group(spec.scheme, x + c, y + c, spec.group, mask ? mask + c : nullptr);
}

// Calls use(r0, r1, tile) for each tile of rows [r0, r1) of w [O, K], fake-quantized into one
// reused, counted scratch tile: both GEMM directions read the weight this way.
template <class T, class W, class Use>
void for_each_fake_quant_tile(const FakeQuantSpec& spec, const W* w, int64_t O, int64_t K,
                              Use use) {
  const FakeQuantWeight<W> weight(spec, w, O, K);
  const int64_t tr = fake_quant_tile_rows(O, K);
  Tensor tile_buf = Tensor::empty({tr, K}, dtype_of<T>());  // counted scratch
  T* tile = tile_buf.data<T>();
  for (int64_t r0 = 0; r0 < O; r0 += tr) {
    const int64_t r1 = std::min(O, r0 + tr);
    weight.rows(r0, r1, tile);
    use(r0, r1, tile);
  }
}

template <class T, class W>
void tiled_matmul(const FakeQuantSpec& spec, const W* w, const T* x, int64_t N, int64_t O,
                  int64_t K, T* y) {
  for_each_fake_quant_tile<T>(spec, w, O, K, [&](int64_t r0, int64_t r1, const T* tile) {
    gemm<T>(false, true, N, r1 - r0, K, T(1), x, K, tile, K, T(0), y + r0, O);
  });
}

template <class T, class W>
void tiled_matmul_backward(const FakeQuantSpec& spec, const W* w, const T* dy, int64_t N, int64_t O,
                           int64_t K, T* dx) {
  for_each_fake_quant_tile<T>(spec, w, O, K, [&](int64_t r0, int64_t r1, const T* tile) {
    gemm<T>(false, false, N, K, r1 - r0, T(1), dy + r0, O, tile, K, r0 == 0 ? T(0) : T(1), dx, K);
  });
}

}  // namespace

const char* fake_quant_name(FakeQuant scheme) {
  switch (scheme) {
    case FakeQuant::None:
      return "none";
    case FakeQuant::Int4Symmetric:
      return "int4 symmetric per group";
    case FakeQuant::Uint4Asymmetric:
      return "uint4 asymmetric per group";
    case FakeQuant::Int8PerToken:
      return "int8 asymmetric per token";
    case FakeQuant::GgufQ4_0:
      return "gguf Q4_0";
    case FakeQuant::GgufQ8_0:
      return "gguf Q8_0";
    case FakeQuant::GgufQ6_K:
      return "gguf Q6_K";
    case FakeQuant::GgufQ8_K:
      return "gguf Q8_K";
  }
  return "?";
}

bool fake_quant_masks_gradient(FakeQuant scheme) {
  return scheme == FakeQuant::Int4Symmetric || scheme == FakeQuant::Uint4Asymmetric ||
         scheme == FakeQuant::Int8PerToken;
}

int64_t fake_quant_fixed_group(FakeQuant scheme, int64_t cols) {
  switch (scheme) {
    case FakeQuant::Int8PerToken:
      return cols;
    case FakeQuant::GgufQ4_0:
    case FakeQuant::GgufQ8_0:
      return ggml::kBlock;
    case FakeQuant::GgufQ6_K:
    case FakeQuant::GgufQ8_K:
      return ggml::kBlockK;
    default:
      return 0;
  }
}

template <class T>
void fake_quantize_rows(const FakeQuantSpec& spec, const T* x, T* y, int64_t rows, int64_t cols) {
  check_spec(spec, cols);
#pragma omp parallel for schedule(static) if (rows * cols >= 65536)
  for (int64_t r = 0; r < rows; ++r) fq_row(spec, x + r * cols, y + r * cols, cols, nullptr);
}

template <class T>
void fake_quantize_backward(const FakeQuantSpec& spec, const T* x, const T* dy, T* dx, int64_t rows,
                            int64_t cols) {
  check_spec(spec, cols);
  if (!fake_quant_masks_gradient(spec.scheme)) {
    if (dx != dy) std::copy(dy, dy + rows * cols, dx);
    return;
  }
#pragma omp parallel if (rows * cols >= 65536)
  {
    std::vector<T> y(size_t(spec.group));
    std::vector<char> mask(size_t(spec.group));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; c += spec.group) {
        const int64_t o = r * cols + c;
        fq_group(spec.scheme, x + o, y.data(), spec.group, reinterpret_cast<bool*>(mask.data()));
        for (int64_t i = 0; i < spec.group; ++i) dx[o + i] = mask[size_t(i)] ? dy[o + i] : T(0);
      }
  }
}

template <class T>
void fake_quantize_weight_rows(const FakeQuantSpec& spec, const T* W, int64_t r0, int64_t r1,
                               int64_t K, T* tile) {
  check_spec(spec, K);
#pragma omp parallel for schedule(static) if ((r1 - r0) * K >= 65536)
  for (int64_t r = r0; r < r1; ++r) fq_row(spec, W + r * K, tile + (r - r0) * K, K, nullptr);
}

void fake_quantize_weight_rows(const FakeQuantSpec& spec, const uint16_t* W, int64_t r0, int64_t r1,
                               int64_t K, float* tile) {
  check_spec(spec, K);
  bf16_to_f32_array(W + r0 * K, tile, (r1 - r0) * K);
#pragma omp parallel for schedule(static) if ((r1 - r0) * K >= 65536)
  for (int64_t r = r0; r < r1; ++r) {
    float* row = tile + (r - r0) * K;
    fq_row(spec, row, row, K, nullptr);
  }
}

// Only float and bf16 weights keep Q6_K scales: a double W (gradient checks) rounds each block
// through float anyway, and forms its tiles directly.
bool keeps_q6_k_scales(FakeQuant scheme, int64_t elem_bytes) {
  return scheme == FakeQuant::GgufQ6_K && elem_bytes <= 4;
}

template <class W>
FakeQuantWeight<W>::FakeQuantWeight(const FakeQuantSpec& spec, const W* w, int64_t rows,
                                    int64_t cols)
    : spec_(spec), w_(w), cols_(cols) {
  check_spec(spec, cols);
  if constexpr (!std::is_same_v<W, double>) {
    if (!keeps_q6_k_scales(spec.scheme, int64_t(sizeof(W)))) return;
    const int64_t bytes = fake_quant_weight_side_bytes(spec.scheme, rows, cols, sizeof(W));
    q6_k_scales_ = Tensor::empty({(bytes + 3) / 4}, DType::I32);
    auto* scales = reinterpret_cast<ggml::Q6_KScales*>(q6_k_scales_.data<int32_t>());
    const int64_t per_row = cols / ggml::kBlockK;
#pragma omp parallel if (rows * cols >= 65536)
    {
      std::vector<float> widened(std::is_same_v<W, uint16_t> ? size_t(cols) : 0);
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        const float* row = widened.data();
        if constexpr (std::is_same_v<W, uint16_t>)
          bf16_to_f32_array(w + r * cols, widened.data(), cols);
        else
          row = w + r * cols;
        ggml::q6_K_scales(row, scales + r * per_row, cols);
      }
    }
  }
}

template <class W>
void FakeQuantWeight<W>::rows(int64_t r0, int64_t r1, Out* tile) const {
  if (!q6_k_scales_.defined()) return fake_quantize_weight_rows(spec_, w_, r0, r1, cols_, tile);
  if constexpr (!std::is_same_v<W, double>) {
    const auto* scales = reinterpret_cast<const ggml::Q6_KScales*>(q6_k_scales_.data<int32_t>());
    const int64_t per_row = cols_ / ggml::kBlockK;
    const float* in = tile;  // a bf16 W is widened into the tile, then rounded in place
    if constexpr (std::is_same_v<W, uint16_t>)
      bf16_to_f32_array(w_ + r0 * cols_, tile, (r1 - r0) * cols_);
    else
      in = w_ + r0 * cols_;
#pragma omp parallel for schedule(static) if ((r1 - r0) * cols_ >= 65536)
    for (int64_t r = r0; r < r1; ++r)
      ggml::fake_quantize_row_q6_K_scaled(in + (r - r0) * cols_, scales + r * per_row,
                                          tile + (r - r0) * cols_, cols_);
  }
}

template class FakeQuantWeight<float>;
template class FakeQuantWeight<double>;
template class FakeQuantWeight<uint16_t>;

int64_t fake_quant_weight_side_bytes(FakeQuant scheme, int64_t rows, int64_t cols,
                                     int64_t elem_bytes) {
  if (!keeps_q6_k_scales(scheme, elem_bytes)) return 0;
  return rows * (cols / ggml::kBlockK) * int64_t(sizeof(ggml::Q6_KScales));
}

int64_t fake_quant_tile_rows(int64_t rows, int64_t cols) {
  const int64_t by_bytes = (int64_t(1) << 18) / std::max<int64_t>(1, cols);  // 1 MiB of fp32
  return std::max<int64_t>(1, std::min(rows, std::max<int64_t>(64, by_bytes)));
}

template <class T>
void fake_quant_matmul(const FakeQuantSpec& spec, const T* W, const T* x, int64_t N, int64_t O,
                       int64_t K, T* y) {
  tiled_matmul(spec, W, x, N, O, K, y);
}

template <class T>
void fake_quant_matmul_backward(const FakeQuantSpec& spec, const T* W, const T* dy, int64_t N,
                                int64_t O, int64_t K, T* dx) {
  tiled_matmul_backward(spec, W, dy, N, O, K, dx);
}

void fake_quant_matmul_bf16(const FakeQuantSpec& spec, const uint16_t* W, const float* x, int64_t N,
                            int64_t O, int64_t K, float* y) {
  tiled_matmul(spec, W, x, N, O, K, y);
}

void fake_quant_matmul_backward_bf16(const FakeQuantSpec& spec, const uint16_t* W, const float* dy,
                                     int64_t N, int64_t O, int64_t K, float* dx) {
  tiled_matmul_backward(spec, W, dy, N, O, K, dx);
}

#define FT_FQ(T)                                                                                 \
  template void fake_quantize_rows<T>(const FakeQuantSpec&, const T*, T*, int64_t, int64_t);     \
  template void fake_quantize_backward<T>(const FakeQuantSpec&, const T*, const T*, T*, int64_t, \
                                          int64_t);                                              \
  template void fake_quantize_weight_rows<T>(const FakeQuantSpec&, const T*, int64_t, int64_t,   \
                                             int64_t, T*);                                       \
  template void fake_quant_matmul<T>(const FakeQuantSpec&, const T*, const T*, int64_t, int64_t, \
                                     int64_t, T*);                                               \
  template void fake_quant_matmul_backward<T>(const FakeQuantSpec&, const T*, const T*, int64_t, \
                                              int64_t, int64_t, T*);
FT_FQ(float)
FT_FQ(double)
#undef FT_FQ

}  // namespace fusetune::kernels
