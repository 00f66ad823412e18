#pragma once
// NF4 (4-bit NormalFloat, QLoRA) weights: quantization, dequantization of row ranges, and the
// matmuls that dequantize the weight tile by tile inside the GEMM (never a whole fp32 copy).
//
// Format, following bitsandbytes' quantize_4bit(quant_type="nf4", blocksize=64,
// compress_statistics=True) on the row-major flattened weight:
//   - blocks of 64 consecutive elements; each stores 4-bit indices into the 16-value NF4 table
//     of w / absmax(block) (nearest table value);
//   - double quantization of the per-block absmax: offset = mean(absmax); (absmax - offset) is
//     quantized blockwise (256 absmax values per block) to 8-bit indices into bitsandbytes'
//     signed dynamic map (create_dynamic_map), each 256-block with its own fp32 scale.
// Packing is ours (so the data can live in I32 tensors): 8 4-bit codes per int32, element i
// in bits [4*(i%8), 4*(i%8)+4); 4 8-bit absmax codes per int32, block b in byte b%4.
#include <cstdint>

namespace fusetune::kernels {

inline constexpr int64_t kNF4Block = 64;         // weights per absmax
inline constexpr int64_t kNF4AbsmaxBlock = 256;  // absmax values per fp32 scale

const float* nf4_table();        // 16 values, ascending, -1 .. 1
const float* nf4_dynamic_map();  // 256 values, ascending (bitsandbytes signed dynamic map)

struct NF4Sizes {
  int64_t blocks = 0;        // ceil(numel / 64)
  int64_t code_words = 0;    // int32 words of 4-bit codes: ceil(numel / 8)
  int64_t absmax_words = 0;  // int32 words of 8-bit absmax codes: ceil(blocks / 4)
  int64_t scales = 0;        // fp32 scales: ceil(blocks / 256)
};
NF4Sizes nf4_sizes(int64_t numel);

// A read-only view of one quantized [rows, cols] weight.
struct NF4View {
  const int32_t* codes;
  const int32_t* absmax_codes;
  const float* absmax_scales;
  float offset;
  int64_t rows, cols;
};

// Quantizes n values; outputs sized by nf4_sizes(n) (padding codes are 0).
template <class T>
void nf4_quantize(const T* w, int64_t n, int32_t* codes, int32_t* absmax_codes,
                  float* absmax_scales, float* offset);

// The two halves of nf4_quantize, for a weight quantized a range of elements at a time: the
// codes and absmax of w[0, n) (a range that starts on a block boundary: codes and absmax point
// at that block's), then, once every block's absmax is known, their double quantization.
template <class T>
void nf4_quantize_blocks(const T* w, int64_t n, int32_t* codes, float* absmax);
void nf4_quantize_absmax(const float* absmax, int64_t blocks, int32_t* absmax_codes,
                         float* absmax_scales, float* offset);

// The dequantized absmax of block b (what dequantization multiplies by).
float nf4_block_absmax(const NF4View& w, int64_t block);

// out[(r - r0) * cols + j] = W[r, j] for r in [r0, r1).
template <class T>
void nf4_dequantize_rows(const NF4View& w, int64_t r0, int64_t r1, T* out);

// Embedding lookup from an NF4 table W [V, D]: out[i, :] = W[ids[i], :] for i < n, only the
// gathered rows dequantized. Throws on an id outside [0, V).
template <class T>
void nf4_gather_rows(const NF4View& w, const int32_t* ids, int64_t n, T* out);

// Rows of W per dequantized tile in the tiled GEMMs: max(256 rows, 1 MiB of fp32), at most all
// rows (fewer rows made small GEMMs: a Llama 3.2 1B QLoRA step's NF4 matmuls took 18% longer
// with 64). The scratch is tile_rows x cols elements, allocated as a counted Tensor (runtime
// memory stats see it; compile/memory_estimate.cpp predicts it with the same function).
int64_t nf4_tile_rows(int64_t rows, int64_t cols);

// y [N, rows] = x [N, cols] W^T, dequantizing W a tile of rows at a time into the scratch
// (sized so each tile is still a good GEMM); a decode step's few rows (fp32) read the codes
// once instead, dequantizing in registers (decode_gemv.h); a bf16 graph's activations on bf16
// dot products multiply bf16 tiles (nf4_bf16_matmul.h).
template <class T>
void nf4_matmul(const NF4View& w, const T* x, int64_t N, T* y);
// dx [N, cols] = dy [N, rows] W, tile by tile (accumulating into dx); bf16 tiles as above.
template <class T>
void nf4_matmul_backward(const NF4View& w, const T* dy, int64_t N, T* dx);

}  // namespace fusetune::kernels
