#include "fusetune/runtime/bf16_node_kernels.h"

#include <omp.h>

#include <algorithm>
#include <string>
#include <vector>

#include "fusetune/graph/op_desc.h"
#include "fusetune/kernels/cpu/bf16.h"
#include "fusetune/kernels/cpu/bf16_matmul.h"
#include "fusetune/kernels/cpu/embedding_rows.h"
#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/runtime/node_kernels.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

namespace k = kernels;

// Every piece of conversion scratch starts on a cache line.
int64_t padded(int64_t bytes) { return (bytes + 63) / 64 * 64; }
int64_t f32_bytes(int64_t numel) { return padded(numel * 4); }
int64_t f32_bytes(const TensorType& t) { return f32_bytes(t.numel()); }
bool is_bf16(const TensorType& t) { return t.dtype == DType::BF16; }

// Hands out a node's fp32 pieces from one buffer, in the order the kernel asks for them; the
// sizes it may ask for add up to bf16_conversion_scratch_bytes, which checks it.
class Scratch {
 public:
  Scratch(char* base, int64_t bytes) : base_(base), bytes_(bytes) {}
  float* floats(int64_t count) {
    const int64_t want = f32_bytes(count);
    FT_CHECK(used_ + want <= bytes_, "bf16 conversion scratch: a node asked for more than the " +
                                         std::to_string(bytes_) + " bytes planned for it");
    float* p = reinterpret_cast<float*>(base_ + used_);
    used_ += want;
    return p;
  }
  Tensor tensor(const Shape& shape) {
    return Tensor::borrow(floats(shape_numel(shape)), shape, DType::F32, nullptr);
  }
  Tensor widened(const Tensor& t) {
    Tensor out = tensor(t.shape());
    k::bf16_to_f32_array(t.data<uint16_t>(), out.data<float>(), t.numel());
    return out;
  }

 private:
  char* base_;
  int64_t bytes_, used_ = 0;
};

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
void matmul_bf16(const Node& n, const std::vector<Tensor>& in, std::vector<Tensor>& out,
                 Scratch& scratch) {
  const MatMulDims d = matmul_dims(in[0].shape(), in[1].shape(), n.attrs);
  const bool ta = n.attrs.trans_a, tb = n.attrs.trans_b;
  const Tensor A = in[0].dtype() == DType::BF16 ? scratch.widened(in[0]) : in[0];
  Tensor& C = out[0];
  const bool c_bf16 = C.dtype() == DType::BF16;
  if (ta) {
    const Tensor B = in[1].dtype() == DType::BF16 ? scratch.widened(in[1]) : in[1];
    const int64_t ldb = tb ? d.K : d.N;
    if (!c_bf16) {
      k::gemm<float>(true, tb, d.M, d.N, d.K, 1.0f, A.data<float>(), d.M, B.data<float>(), ldb,
                     0.0f, C.data<float>(), d.N);
      return;
    }
    const int64_t tr = k::bf16_tile_rows(d.M, d.N);
    float* tile = scratch.floats(tr * d.N);
    for (int64_t m0 = 0; m0 < d.M; m0 += tr) {
      const int64_t m1 = std::min(d.M, m0 + tr);
      // Rows [m0, m1) of C read columns [m0, m1) of A (stored [K, M]).
      k::gemm<float>(true, tb, m1 - m0, d.N, d.K, 1.0f, A.data<float>() + m0, d.M, B.data<float>(),
                     ldb, 0.0f, tile, d.N);
      k::f32_to_bf16_array(tile, C.data<uint16_t>() + m0 * d.N, (m1 - m0) * d.N);
    }
    return;
  }
  Tensor C32 = c_bf16 ? scratch.tensor(C.shape()) : C;
  if (in[1].dtype() == DType::BF16) {
    const int64_t rows = tb ? d.N : d.K, cols = tb ? d.K : d.N;
    float* tile = scratch.floats(k::bf16_weight_tile_rows(tb, rows, cols) * cols);
    k::gemm_bf16_weight(tb, d.M, d.N, d.K, A.data<float>(), in[1].data<uint16_t>(),
                        C32.data<float>(), tile);
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

// Pointwise ops (output element i from input elements i, or from a one-element operand) run
// in chunks: each thread widens a chunk of every bf16 operand, runs the fp32 kernel on the
// chunk and rounds the chunk's outputs, so nothing the size of a tensor is ever widened and
// the chunks stay in cache (widening whole [tokens, ffn] tensors made a bf16 1B LoRA step's
// SwiGLU and fused elementwise ops 5-9x slower than fp32's). Below the kernels' parallel
// threshold, so they run serially inside this parallel loop.
constexpr int64_t kChunk = 16384;

bool is_pointwise(Op op) { return op_desc(op).bf16_pointwise; }

// Floating operands only, each the output's size or a single element, at least one bf16.
bool is_chunked_pointwise(const Node& n, const Graph& g) {
  if (!is_pointwise(n.op)) return false;
  const int64_t numel = n.outputs[0].numel();
  bool any_bf16 = false;
  for (const TensorType& t : n.outputs) {
    if (t.numel() != numel || !is_floating(t.dtype)) return false;
    any_bf16 |= is_bf16(t);
  }
  for (const Value& v : n.inputs) {
    const TensorType& t = g.type(v);
    if ((t.numel() != numel && t.numel() != 1) || !is_floating(t.dtype)) return false;
    any_bf16 |= is_bf16(t);
  }
  return any_bf16;
}

// Per thread, one chunk buffer per bf16 full-size operand; one padded slot per bf16 single
// element (widened once for every chunk).
int64_t chunked_pointwise_bytes(const Node& n, const Graph& g) {
  const int64_t numel = n.outputs[0].numel();
  int64_t chunk_buffers = 0, scalars = 0;
  for (const TensorType& t : n.outputs) chunk_buffers += is_bf16(t);
  for (const Value& v : n.inputs) {
    const TensorType& t = g.type(v);
    if (!is_bf16(t)) continue;
    if (t.numel() == numel) {
      ++chunk_buffers;
    } else {
      ++scalars;
    }
  }
  return scalars * f32_bytes(1) + omp_get_max_threads() * chunk_buffers * f32_bytes(kChunk);
}

void run_chunked_pointwise(const Node& n, const std::vector<Tensor>& in, std::vector<Tensor>& out,
                           Scratch& scratch) {
  const int64_t numel = out[0].numel();
  // One-element operands: widened once, passed whole to every chunk.
  std::vector<Tensor> whole(in.size());
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i].numel() != numel)
      whole[i] = in[i].dtype() == DType::BF16 ? scratch.widened(in[i]) : in[i];
  // Per thread, a chunk buffer for every chunked bf16 operand (inputs, then outputs).
  const int threads = omp_get_max_threads();
  std::vector<std::vector<float*>> buffers(static_cast<size_t>(threads));
  for (auto& b : buffers)
    for (size_t i = 0; i < in.size() + out.size(); ++i) {
      const bool input = i < in.size();
      const Tensor& t = input ? in[i] : out[i - in.size()];
      const bool chunked_bf16 = t.dtype() == DType::BF16 && (!input || !whole[i].defined());
      b.push_back(chunked_bf16 ? scratch.floats(kChunk) : nullptr);
    }
  const int64_t chunks = (numel + kChunk - 1) / kChunk;
#pragma omp parallel num_threads(threads) if (chunks > 1)
  {
    const std::vector<float*>& buf = buffers[size_t(omp_get_thread_num())];
    std::vector<Tensor> cin(in.size()), cout(out.size());
#pragma omp for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t i0 = c * kChunk, m = std::min(kChunk, numel - i0);
      for (size_t i = 0; i < in.size(); ++i) {
        if (whole[i].defined()) {
          cin[i] = whole[i];
        } else if (in[i].dtype() == DType::BF16) {
          k::bf16_to_f32_array(in[i].data<uint16_t>() + i0, buf[i], m);
          cin[i] = Tensor::borrow(buf[i], {m}, DType::F32, nullptr);
        } else {
          cin[i] = Tensor::borrow(in[i].data<float>() + i0, {m}, DType::F32, nullptr);
        }
      }
      for (size_t o = 0; o < out.size(); ++o) {
        float* p = out[o].dtype() == DType::BF16 ? buf[in.size() + o] : out[o].data<float>() + i0;
        cout[o] = Tensor::borrow(p, {m}, DType::F32, nullptr);
      }
      run_f32_node_kernel(n, cin, cout);
      for (size_t o = 0; o < out.size(); ++o)
        if (out[o].dtype() == DType::BF16)
          k::f32_to_bf16_array(buf[in.size() + o], out[o].data<uint16_t>() + i0, m);
    }
  }
}

}  // namespace

bool kernel_reads_bf16(const Node& n, size_t input) {
  const OpDesc& d = op_desc(n.op);
  return d.reads_bf16 && d.reads_bf16(n, input);
}

void run_bf16_node_kernel(const Graph& g, const Node& n, const std::vector<Tensor>& in,
                          std::vector<Tensor>& out, const NodeScratch& planned) {
  if (is_single_matmul(n, g) &&
      k::matmul_bf16_native(n.attrs.trans_a, n.attrs.trans_b, in[0], in[1], out[0]))
    return;  // oneDNN: no widening scratch
  const int64_t need = bf16_conversion_scratch_bytes(g, n);
  Tensor owned;  // eager mode: this node's scratch, counted, freed when it ends
  char* base = planned.data;
  if (need > planned.bytes) {
    owned = Tensor::empty({(need + 3) / 4}, DType::F32);
    base = static_cast<char*>(owned.raw());
  }
  Scratch scratch(base, need);
  if (is_single_matmul(n, g)) return matmul_bf16(n, in, out, scratch);
  if (n.op == Op::Embedding && in[0].dtype() == DType::BF16 && out[0].dtype() == DType::BF16) {
    // A lookup copies rows: bf16 in, bf16 out, nothing to compute.
    k::embedding_forward<uint16_t>(in[0].data<uint16_t>(), in[1].data<int32_t>(),
                                   out[0].data<uint16_t>(), in[1].numel(), in[0].dim(1),
                                   in[0].dim(0));
    return;
  }
  if (is_chunked_pointwise(n, g)) return run_chunked_pointwise(n, in, out, scratch);
  if (n.op == Op::EmbeddingBackward && out[0].dtype() == DType::BF16) {
    const Tensor dy = in[0].dtype() == DType::BF16 ? scratch.widened(in[0]) : in[0];
    k::embedding_backward_bf16(dy.data<float>(), in[1].data<int32_t>(), out[0].data<uint16_t>(),
                               in[1].numel(), out[0].dim(1), out[0].dim(0),
                               k::embedding_rows_to_clear(out[0]));
    k::record_embedding_rows(out[0], in[1].data<int32_t>(), in[1].numel());
    return;
  }
  std::vector<Tensor> in32(in.size()), out32(out.size());
  for (size_t i = 0; i < in.size(); ++i)
    in32[i] =
        in[i].dtype() == DType::BF16 && !kernel_reads_bf16(n, i) ? scratch.widened(in[i]) : in[i];
  for (size_t k = 0; k < out.size(); ++k)
    out32[k] = out[k].dtype() == DType::BF16 ? scratch.tensor(out[k].shape()) : out[k];
  run_f32_node_kernel(n, in32, out32);
  for (size_t k = 0; k < out.size(); ++k)
    if (out[k].dtype() == DType::BF16) round_into(out32[k], out[k]);
}

int64_t bf16_conversion_scratch_bytes(const Graph& g, const Node& n) {
  if (g.float_dtype() != DType::BF16) return 0;
  if (is_single_matmul(n, g)) {
    const TensorType &a = g.type(n.inputs[0]), &b = g.type(n.inputs[1]), &c = n.outputs[0];
    const MatMulDims d = matmul_dims(a.shape, b.shape, n.attrs);
    int64_t bytes = is_bf16(a) ? f32_bytes(a) : 0;
    if (n.attrs.trans_a)
      return bytes + (is_bf16(b) ? f32_bytes(b) : 0) +
             (is_bf16(c) ? f32_bytes(k::bf16_tile_rows(d.M, d.N) * d.N) : 0);
    const bool tb = n.attrs.trans_b;
    const int64_t rows = tb ? d.N : d.K, cols = tb ? d.K : d.N;
    return bytes + (is_bf16(c) ? f32_bytes(c) : 0) +
           (is_bf16(b) ? f32_bytes(k::bf16_weight_tile_rows(tb, rows, cols) * cols) : 0);
  }
  if (n.op == Op::Embedding && is_bf16(g.type(n.inputs[0]))) return 0;
  if (is_chunked_pointwise(n, g)) return chunked_pointwise_bytes(n, g);
  if (n.op == Op::EmbeddingBackward && is_bf16(n.outputs[0]))  // dy widened
    return is_bf16(g.type(n.inputs[0])) ? f32_bytes(g.type(n.inputs[0])) : 0;
  int64_t bytes = 0;
  for (size_t i = 0; i < n.inputs.size(); ++i)
    if (is_bf16(g.type(n.inputs[i])) && !kernel_reads_bf16(n, i))
      bytes += f32_bytes(g.type(n.inputs[i]));
  for (const TensorType& t : n.outputs)
    if (is_bf16(t)) bytes += f32_bytes(t);
  return bytes;
}

}  // namespace fusetune
