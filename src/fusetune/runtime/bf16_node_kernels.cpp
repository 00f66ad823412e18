#include "fusetune/runtime/bf16_node_kernels.h"

#include <omp.h>

#include <algorithm>
#include <vector>

#include "fusetune/kernels/cpu/bf16.h"
#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/runtime/node_kernels.h"

namespace fusetune {
namespace {

namespace k = kernels;

Tensor widen(const Tensor& t) {
  Tensor out = Tensor::empty(t.shape(), DType::F32);  // counted scratch
  k::bf16_to_f32_array(t.data<uint16_t>(), out.data<float>(), t.numel());
  return out;
}

void round_into(const Tensor& f32, Tensor& bf16) {
  k::f32_to_bf16_array(f32.data<float>(), bf16.data<uint16_t>(), f32.numel());
}

struct MatMulDims {
  int64_t batch = 1, M = 0, N = 0, K = 0;
};

MatMulDims matmul_dims(const Shape& sa, const Shape& sb, const Attrs& a) {
  const size_t r = sa.size();
  MatMulDims d;
  for (size_t i = 0; i + 2 < r; ++i) d.batch *= sa[i];
  d.M = a.trans_a ? sa[r - 1] : sa[r - 2];
  d.K = a.trans_a ? sa[r - 2] : sa[r - 1];
  d.N = a.trans_b ? sb[r - 2] : sb[r - 1];
  return d;
}

// A single (unbatched) product with bf16 operands, never widening B or C whole:
//  - trans_a (dW = dy^T x, the weight-gradient form: C is weight-sized, B an activation):
//    C is computed a tile of rows at a time and rounded into the bf16 output;
//  - otherwise (x W^T, dy W: B is the weight): B is widened a tile of its rows at a time.
void matmul_bf16(const Node& n, const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const MatMulDims d = matmul_dims(in[0].shape(), in[1].shape(), n.attrs);
  const bool ta = n.attrs.trans_a, tb = n.attrs.trans_b;
  const Tensor A = in[0].dtype() == DType::BF16 ? widen(in[0]) : in[0];
  Tensor& C = out[0];
  const bool c_bf16 = C.dtype() == DType::BF16;
  if (ta) {
    const Tensor B = in[1].dtype() == DType::BF16 ? widen(in[1]) : in[1];
    const int64_t ldb = tb ? d.K : d.N;
    if (!c_bf16) {
      k::gemm<float>(true, tb, d.M, d.N, d.K, 1.0f, A.data<float>(), d.M, B.data<float>(), ldb,
                     0.0f, C.data<float>(), d.N);
      return;
    }
    const int64_t tr = k::bf16_tile_rows(d.M, d.N);
    Tensor tile = Tensor::empty({tr, d.N}, DType::F32);  // counted scratch
    for (int64_t m0 = 0; m0 < d.M; m0 += tr) {
      const int64_t m1 = std::min(d.M, m0 + tr);
      // Rows [m0, m1) of C read columns [m0, m1) of A (stored [K, M]).
      k::gemm<float>(true, tb, m1 - m0, d.N, d.K, 1.0f, A.data<float>() + m0, d.M, B.data<float>(),
                     ldb, 0.0f, tile.data<float>(), d.N);
      k::f32_to_bf16_array(tile.data<float>(), C.data<uint16_t>() + m0 * d.N, (m1 - m0) * d.N);
    }
    return;
  }
  Tensor C32 = c_bf16 ? Tensor::empty(C.shape(), DType::F32) : C;
  if (in[1].dtype() == DType::BF16) {
    k::gemm_bf16_weight(tb, d.M, d.N, d.K, A.data<float>(), in[1].data<uint16_t>(),
                        C32.data<float>());
  } else {
    k::gemm<float>(false, tb, d.M, d.N, d.K, 1.0f, A.data<float>(), d.K, in[1].data<float>(),
                   tb ? d.K : d.N, 0.0f, C32.data<float>(), d.N);
  }
  if (c_bf16) round_into(C32, C);
}

bool is_single_matmul(const Node& n, const Graph& g) {
  if (n.op != Op::MatMul) return false;
  const Shape& sa = g.shape(n.inputs[0]);
  int64_t batch = 1;
  for (size_t i = 0; i + 2 < sa.size(); ++i) batch *= sa[i];
  return batch == 1;
}

int64_t f32_bytes(const TensorType& t) { return t.numel() * 4; }

// A same-shape Add of bf16 tensors (the sum of a tied embedding's two [V, D] gradients, the
// residual stream's gradients), in chunks: widening both operands whole would take three fp32
// copies of a weight-sized tensor.
constexpr int64_t kAddChunk = 16384;

bool is_chunked_add(const Node& n, const Graph& g) {
  if (n.op != Op::Add) return false;
  const TensorType &a = g.type(n.inputs[0]), &b = g.type(n.inputs[1]);
  return a.shape == b.shape && a.dtype == DType::BF16 && b.dtype == DType::BF16 &&
         n.outputs[0].dtype == DType::BF16;
}

void add_bf16_chunked(const uint16_t* a, const uint16_t* b, uint16_t* out, int64_t n) {
  const int64_t chunks = (n + kAddChunk - 1) / kAddChunk;
#pragma omp parallel if (n >= 4 * kAddChunk)
  {
    std::vector<float> x(kAddChunk), y(kAddChunk);
#pragma omp for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t i0 = c * kAddChunk, m = std::min(kAddChunk, n - i0);
      // Widen (exact), add in fp32, round once; the array conversions vectorize (and run
      // serially here, inside this parallel loop).
      k::bf16_to_f32_array(a + i0, x.data(), m);
      k::bf16_to_f32_array(b + i0, y.data(), m);
      for (int64_t i = 0; i < m; ++i) x[size_t(i)] += y[size_t(i)];
      k::f32_to_bf16_array(x.data(), out + i0, m);
    }
  }
}

}  // namespace

bool kernel_reads_bf16(const Node& n, size_t input) {
  switch (n.op) {
    case Op::FusedLinearCrossEntropy:
      return input == 1;
    case Op::FusedLinearLogProbs:
      return input == 2 && n.inputs.size() == 3;  // a dense head (an NF4 head has 3 inputs)
    case Op::FusedLinearLogProbsBackward:
      return input == 4 && n.inputs.size() == 5;
    case Op::FakeQuantMatMul:  // the weight, widened a tile of rows at a time
    case Op::FakeQuantMatMulBackward:
      return input == 1;
    default:
      return false;
  }
}

void run_bf16_node_kernel(const Graph& g, const Node& n, const std::vector<Tensor>& in,
                          std::vector<Tensor>& out) {
  if (is_single_matmul(n, g)) return matmul_bf16(n, in, out);
  if (n.op == Op::Embedding && in[0].dtype() == DType::BF16 && out[0].dtype() == DType::BF16) {
    // A lookup copies rows: bf16 in, bf16 out, nothing to compute.
    k::embedding_forward<uint16_t>(in[0].data<uint16_t>(), in[1].data<int32_t>(),
                                   out[0].data<uint16_t>(), in[1].numel(), in[0].dim(1),
                                   in[0].dim(0));
    return;
  }
  if (is_chunked_add(n, g))
    return add_bf16_chunked(in[0].data<uint16_t>(), in[1].data<uint16_t>(), out[0].data<uint16_t>(),
                            out[0].numel());
  if (n.op == Op::EmbeddingBackward && out[0].dtype() == DType::BF16) {
    const Tensor dy = in[0].dtype() == DType::BF16 ? widen(in[0]) : in[0];
    k::embedding_backward_bf16(dy.data<float>(), in[1].data<int32_t>(), out[0].data<uint16_t>(),
                               in[1].numel(), out[0].dim(1), out[0].dim(0));
    return;
  }
  std::vector<Tensor> in32(in.size()), out32(out.size());
  for (size_t i = 0; i < in.size(); ++i)
    in32[i] = in[i].dtype() == DType::BF16 && !kernel_reads_bf16(n, i) ? widen(in[i]) : in[i];
  for (size_t k = 0; k < out.size(); ++k)
    out32[k] = out[k].dtype() == DType::BF16 ? Tensor::empty(out[k].shape(), DType::F32) : out[k];
  run_f32_node_kernel(n, in32, out32);
  in32.clear();  // free the widened inputs before the rounded outputs are written
  for (size_t k = 0; k < out.size(); ++k)
    if (out[k].dtype() == DType::BF16) round_into(out32[k], out[k]);
}

int64_t bf16_conversion_scratch_bytes(const Graph& g, const Node& n) {
  if (g.float_dtype() != DType::BF16) return 0;
  auto bf16 = [&](const TensorType& t) { return t.dtype == DType::BF16; };
  if (is_single_matmul(n, g)) {
    const TensorType &a = g.type(n.inputs[0]), &b = g.type(n.inputs[1]), &c = n.outputs[0];
    const MatMulDims d = matmul_dims(a.shape, b.shape, n.attrs);
    int64_t bytes = bf16(a) ? f32_bytes(a) : 0;
    if (n.attrs.trans_a)
      return bytes + (bf16(b) ? f32_bytes(b) : 0) +
             (bf16(c) ? k::bf16_tile_rows(d.M, d.N) * d.N * 4 : 0);
    const int64_t rows = n.attrs.trans_b ? d.N : d.K, cols = n.attrs.trans_b ? d.K : d.N;
    return bytes + (bf16(b) ? k::bf16_tile_rows(rows, cols) * cols * 4 : 0) +
           (bf16(c) ? f32_bytes(c) : 0);
  }
  if (n.op == Op::Embedding && bf16(g.type(n.inputs[0]))) return 0;
  if (is_chunked_add(n, g)) return omp_get_max_threads() * 2 * kAddChunk * 4;
  if (n.op == Op::EmbeddingBackward && bf16(n.outputs[0]))  // dy widened, per-row sums
    return (bf16(g.type(n.inputs[0])) ? f32_bytes(g.type(n.inputs[0])) : 0) +
           omp_get_max_threads() * n.outputs[0].shape[1] * 4;
  int64_t bytes = 0;
  for (size_t i = 0; i < n.inputs.size(); ++i)
    if (bf16(g.type(n.inputs[i])) && !kernel_reads_bf16(n, i))
      bytes += f32_bytes(g.type(n.inputs[i]));
  for (const TensorType& t : n.outputs)
    if (bf16(t)) bytes += f32_bytes(t);
  return bytes;
}

}  // namespace fusetune
