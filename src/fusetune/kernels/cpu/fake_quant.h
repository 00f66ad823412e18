#pragma once
// Fake quantization for quantization-aware training: x -> dequantize(quantize(x)), group by
// group along each row, and the matmuls that fake-quantize a weight tile by tile inside the
// GEMM (never a whole fake-quantized copy of the weight), as nf4.h does for NF4.
//
// Schemes (the formulas of torchao's QAT quantizers and of ggml's reference quantizers):
//   Int4Symmetric   torchao Int8DynActInt4WeightQATQuantizer, weights: per group of `group`
//                   elements, s = max(|x|) / 7.5 (at least fp32 eps), q = clamp(round(x / s),
//                   -8, 7), y = q s (round half to even, x / s computed as x * (1 / s)).
//   Uint4Asymmetric torchao Int4WeightOnlyQATQuantizer, weights: per group, s = max(max - min,
//                   1e-6) / 15, zero = min + 8 s, both rounded to bf16 (torchao's
//                   scales_precision); lo = bf16(zero - 8 s); q = clamp(round((x - lo) / s),
//                   0, 15); y = (q - 8) s + zero.
//   Int8PerToken    torchao Int8DynActInt4WeightQATQuantizer, activations: per row (group =
//                   the row), asymmetric: lo = min(min(x), 0), hi = max(max(x), 0),
//                   s = max((hi - lo) / 255, fp32 eps), zp = clamp(-128 - round(lo / s), -128,
//                   127), q = clamp(round(x / s) + zp, -128, 127), y = (q - zp) s.
//   GgufQ4_0        ggml's Q4_0 (blocks of 32, fp16 scale), ggml/ggml_quant.h.
//   GgufQ8_0        ggml's Q8_0 (blocks of 32, fp16 scale): llama.cpp's CPU matmul quantizes
//                   the activations of a Q4_0 or Q8_0 weight to Q8_0 (its vec_dot_type).
//   GgufQ6_K        ggml's Q6_K (super-blocks of 256 along the row): a Q4_0 file's output head
//                   when its rows are a multiple of 256.
//   GgufQ8_K        ggml's Q8_K (blocks of 256, fp32 scale): the activations of a Q6_K weight.
// The straight-through estimator: the gradient w.r.t. x is dy, except that the torchao schemes
// zero it where the unclamped q falls outside [qmin, qmax] (torchao's _GenericFakeQuantize
// mask; the scale is treated as a constant). The gguf schemes pass dy through unchanged.
// float64 runs the same formulas in double (gradient checks); the gguf schemes round through
// fp32, as ggml's reference functions take float.
#include <cstdint>
#include <type_traits>

#include "fusetune/core/tensor.h"

namespace fusetune::kernels {

enum class FakeQuant : int {
  None = 0,
  Int4Symmetric = 1,
  Uint4Asymmetric = 2,
  Int8PerToken = 3,
  GgufQ4_0 = 4,
  GgufQ8_0 = 5,
  GgufQ6_K = 6,
  GgufQ8_K = 7,
};

struct FakeQuantSpec {
  FakeQuant scheme = FakeQuant::None;
  int64_t group = 0;  // elements per quantization group along a row (Int8PerToken: the row)
};

const char* fake_quant_name(FakeQuant scheme);
// Whether the scheme's straight-through gradient is masked (torchao) or dy itself (gguf).
bool fake_quant_masks_gradient(FakeQuant scheme);
// The group length the scheme needs for rows of `cols` elements (0: any that divides cols).
int64_t fake_quant_fixed_group(FakeQuant scheme, int64_t cols);

// y[r, :] = fake_quantize(x[r, :]) for each of `rows` rows of `cols` (a multiple of the group).
// y may be x.
template <class T>
void fake_quantize_rows(const FakeQuantSpec& spec, const T* x, T* y, int64_t rows, int64_t cols);

// The straight-through gradient: dx = dy, masked for the torchao schemes. dx may be dy.
template <class T>
void fake_quantize_backward(const FakeQuantSpec& spec, const T* x, const T* dy, T* dx, int64_t rows,
                            int64_t cols);

// Rows of W per fake-quantized tile in the matmuls (max(64 rows, 1 MiB of
// fp32), at most all rows).
int64_t fake_quant_tile_rows(int64_t rows, int64_t cols);

// Rows [r0, r1) of W [., K], fake-quantized, into tile [r1 - r0, K]: the one step every tiled
// product (the matmuls below, the fused LM head) forms fq(W) with. A bf16 W is widened first.
template <class T>
void fake_quantize_weight_rows(const FakeQuantSpec& spec, const T* W, int64_t r0, int64_t r1,
                               int64_t K, T* tile);
void fake_quantize_weight_rows(const FakeQuantSpec& spec, const uint16_t* W, int64_t r0, int64_t r1,
                               int64_t K, float* tile);

// A weight W [rows, cols] to be fake-quantized a tile of rows at a time, possibly many times over
// (the fused LM head forms each tile twice per chunk of tokens). For Q6_K the costly part,
// ggml's scale search, runs once here for every row, into a counted side table of 18 bytes per
// 256 weights (1.8% of an fp32 W); each tile then only rounds against it (ggml_quant.h). The
// other schemes find a block's scale in one pass over it and keep nothing. W: float, double, or
// uint16_t (bf16, widened to float tiles).
template <class W>
class FakeQuantWeight {
 public:
  using Out = std::conditional_t<std::is_same_v<W, uint16_t>, float, W>;
  FakeQuantWeight(const FakeQuantSpec& spec, const W* w, int64_t rows, int64_t cols);
  // Rows [r0, r1) of fq(W) into tile [r1 - r0, cols].
  void rows(int64_t r0, int64_t r1, Out* tile) const;

 private:
  FakeQuantSpec spec_;
  const W* w_;
  int64_t cols_;
  Tensor q6_k_scales_;  // ggml::Q6_KScales per block of 256 (raw bytes in I32 storage)
};
// Bytes of FakeQuantWeight's side table for a W of that shape and element size (the planner
// counts it with the tile).
int64_t fake_quant_weight_side_bytes(FakeQuant scheme, int64_t rows, int64_t cols,
                                     int64_t elem_bytes);

// y [N, O] = x [N, K] fq(W)^T with W [O, K]; fq(W) formed a tile of rows at a time.
template <class T>
void fake_quant_matmul(const FakeQuantSpec& spec, const T* W, const T* x, int64_t N, int64_t O,
                       int64_t K, T* y);
// dx [N, K] = dy [N, O] fq(W), tile by tile.
template <class T>
void fake_quant_matmul_backward(const FakeQuantSpec& spec, const T* W, const T* dy, int64_t N,
                                int64_t O, int64_t K, T* dx);
// The same with W stored bf16 (a bf16 run): its rows are widened and fake-quantized per tile.
void fake_quant_matmul_bf16(const FakeQuantSpec& spec, const uint16_t* W, const float* x, int64_t N,
                            int64_t O, int64_t K, float* y);
void fake_quant_matmul_backward_bf16(const FakeQuantSpec& spec, const uint16_t* W, const float* dy,
                                     int64_t N, int64_t O, int64_t K, float* dx);

}  // namespace fusetune::kernels
