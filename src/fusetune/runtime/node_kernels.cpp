#include "fusetune/runtime/node_kernels.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "fusetune/kernels/cpu/bf16.h"
#include "fusetune/kernels/cpu/elementwise_program.h"
#include "fusetune/kernels/cpu/fake_quant.h"
#include "fusetune/kernels/cpu/flash_attention.h"
#include "fusetune/kernels/cpu/fused_linear_cross_entropy.h"
#include "fusetune/kernels/cpu/fused_linear_log_probs.h"
#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/kernels/cpu/kv_cache_attention.h"
#include "fusetune/kernels/cpu/nf4.h"
#include "fusetune/kernels/cpu/peft_ops.h"
#include "fusetune/kernels/cpu/preference_ops.h"
#include "fusetune/kernels/cpu/rmsnorm_fused.h"
#include "fusetune/kernels/cpu/swiglu.h"
#include "fusetune/runtime/bf16_node_kernels.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

int64_t prod(const Shape& s, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to; ++i) p *= s[i];
  return p;
}

template <class T>
void run_typed(const Node& n, const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  namespace k = kernels;
  auto X = [&](size_t i) { return in[i].data<T>(); };
  auto I = [&](size_t i) { return in[i].data<int32_t>(); };
  T* Y = out[0].data<T>();
  const Attrs& a = n.attrs;
  switch (n.op) {
    case Op::Fill:
      std::fill(Y, Y + out[0].numel(), T(a.scalar));
      break;
    case Op::MatMul: {
      const Shape& sa = in[0].shape();
      const Shape& sb = in[1].shape();
      const size_t r = sa.size();
      int64_t batch = prod(sa, 0, r - 2);
      int64_t M = a.trans_a ? sa[r - 1] : sa[r - 2];
      int64_t K = a.trans_a ? sa[r - 2] : sa[r - 1];
      int64_t N = a.trans_b ? sb[r - 2] : sb[r - 1];
      if (batch == 1)
        k::gemm<T>(a.trans_a, a.trans_b, M, N, K, T(1), X(0), sa[r - 1], X(1), sb[r - 1], T(0), Y,
                   N);
      else
        k::gemm_batched<T>(batch, a.trans_a, a.trans_b, M, N, K, T(1), X(0), M * K, X(1), K * N,
                           T(0), Y, M * N);
      break;
    }
    case Op::Add:
      k::add<T>(X(0), X(1), Y, in[0].numel(), in[1].numel());
      break;
    case Op::Mul:
      k::mul<T>(X(0), X(1), Y, in[0].numel(), in[1].numel());
      break;
    case Op::Scale:
      k::scale<T>(X(0), T(a.scalar), Y, in[0].numel());
      break;
    case Op::Silu:
      k::silu<T>(X(0), Y, in[0].numel());
      break;
    case Op::SiluBackward:
      k::silu_backward<T>(X(0), X(1), Y, in[0].numel());
      break;
    case Op::SumAll:
      Y[0] = T(k::sum_all<T>(X(0), in[0].numel()));
      break;
    case Op::Expand:
      std::fill(Y, Y + out[0].numel(), X(0)[0]);
      break;
    case Op::SumToShape:
      k::sum_to_suffix<T>(X(0), Y, in[0].numel(), out[0].numel());
      break;
    case Op::RMSNorm: {
      int64_t D = in[0].shape().back();
      k::rmsnorm_forward<T>(X(0), X(1), Y, in[0].numel() / D, D, a.eps);
      break;
    }
    case Op::RMSNormBackward: {
      int64_t D = in[0].shape().back();
      k::rmsnorm_backward<T>(X(0), X(1), X(2), Y, out[1].data<T>(), in[0].numel() / D, D, a.eps);
      break;
    }
    case Op::Rope: {
      const Shape& s = in[0].shape();
      k::rope<T>(X(0), X(1), X(2), I(3), Y, s[0], s[1], s[2], s[3], a.inverse);
      break;
    }
    case Op::Softmax: {
      int64_t C = in[0].shape().back();
      k::softmax_rows<T>(X(0), Y, in[0].numel() / C, C);
      break;
    }
    case Op::SoftmaxBackward: {
      int64_t C = in[0].shape().back();
      k::softmax_backward<T>(X(0), X(1), Y, in[0].numel() / C, C);
      break;
    }
    case Op::LogSoftmax: {
      int64_t C = in[0].shape().back();
      k::log_softmax_rows<T>(X(0), Y, in[0].numel() / C, C);
      break;
    }
    case Op::LogSoftmaxBackward: {
      int64_t C = in[0].shape().back();
      k::log_softmax_backward<T>(X(0), X(1), Y, in[0].numel() / C, C);
      break;
    }
    case Op::Nll:
      Y[0] = T(k::nll_sum<T>(X(0), I(1), in[0].dim(0), in[0].dim(1)));
      break;
    case Op::NllBackward:
      k::nll_backward<T>(X(0)[0], I(1), Y, out[0].dim(0), out[0].dim(1));
      break;
    case Op::Embedding:
      k::embedding_forward<T>(X(0), I(1), Y, in[1].numel(), in[0].dim(1), in[0].dim(0));
      break;
    case Op::EmbeddingBackward:
      k::embedding_backward<T>(X(0), I(1), Y, in[1].numel(), out[0].dim(1), out[0].dim(0));
      break;
    case Op::CausalMask:
    case Op::CausalMaskBackward: {
      const Shape& s = in[0].shape();
      const int32_t* docs = in.size() > 1 ? I(1) : nullptr;
      if (n.op == Op::CausalMask)
        k::causal_mask<T>(X(0), docs, Y, s[0], s[1], s[2]);
      else
        k::causal_mask_backward<T>(X(0), docs, Y, s[0], s[1], s[2]);
      break;
    }
    case Op::RepeatHeads: {
      const Shape& s = in[0].shape();
      k::repeat_heads<T>(X(0), Y, s[0], s[1], a.groups, s[2] * s[3]);
      break;
    }
    case Op::RepeatHeadsBackward: {
      const Shape& s = out[0].shape();
      k::repeat_heads_backward<T>(X(0), Y, s[0], s[1], a.groups, s[2] * s[3]);
      break;
    }
    case Op::Transpose: {
      const Shape& s = in[0].shape();
      size_t r = s.size();
      size_t d0 = size_t(a.dim0 < 0 ? a.dim0 + int(r) : a.dim0);
      size_t d1 = size_t(a.dim1 < 0 ? a.dim1 + int(r) : a.dim1);
      if (d0 > d1) std::swap(d0, d1);
      if (d0 == d1) {
        std::memcpy(Y, X(0), in[0].nbytes());
        break;
      }
      k::transpose<T>(X(0), Y, prod(s, 0, d0), s[d0], prod(s, d0 + 1, d1), s[d1],
                      prod(s, d1 + 1, r));
      break;
    }
    case Op::Slice:
    case Op::SliceBackward: {
      const Shape& full = n.op == Op::Slice ? in[0].shape() : out[0].shape();
      size_t r = full.size();
      size_t d = size_t(a.dim0 < 0 ? a.dim0 + int(r) : a.dim0);
      if (n.op == Op::Slice)
        k::slice<T>(X(0), Y, prod(full, 0, d), full[d], prod(full, d + 1, r), a.start, a.len);
      else
        k::slice_backward<T>(X(0), Y, prod(full, 0, d), full[d], prod(full, d + 1, r), a.start,
                             a.len);
      break;
    }
    case Op::FusedLinearCrossEntropy: {
      const int64_t N = in[0].dim(0), D = in[0].dim(1), V = in[1].dim(0);
      T* dh = out[1].data<T>();
      T* dW = a.no_weight_grad ? nullptr : out[2].data<T>();
      // A fake-quantized head (QAT) while fake quantization is switched on.
      const bool fq = in.size() == 5 && I(4)[0] != 0;
      const k::FakeQuantSpec spec{k::FakeQuant(a.groups), a.len};
      if constexpr (std::is_same_v<T, float>) {
        if (in[1].dtype() == DType::BF16) {  // a bf16 head, read tile by tile
          const uint16_t* w = in[1].data<uint16_t>();
          Y[0] = float(fq ? k::fused_fake_quant_bf16_linear_cross_entropy(
                                spec, X(0), w, I(2), X(3)[0], N, D, V, a.chunk_rows, dh, dW)
                          : k::fused_bf16_linear_cross_entropy(X(0), w, I(2), X(3)[0], N, D, V,
                                                               a.chunk_rows, dh, dW));
          break;
        }
      }
      Y[0] = T(fq ? k::fused_fake_quant_linear_cross_entropy<T>(spec, X(0), X(1), I(2), X(3)[0], N,
                                                                D, V, a.chunk_rows, dh, dW)
                  : k::fused_linear_cross_entropy<T>(X(0), X(1), I(2), X(3)[0], N, D, V,
                                                     a.chunk_rows, dh, dW));
      break;
    }
    case Op::FusedNF4LinearCrossEntropy: {
      const k::NF4View w{
          I(3),       I(4),      reinterpret_cast<const float*>(I(5)), float(a.scalar),
          a.shape[0], a.shape[1]};
      Y[0] = T(k::fused_nf4_linear_cross_entropy<T>(X(0), w, I(1), X(2)[0], in[0].dim(0),
                                                    a.chunk_rows, out[1].data<T>()));
      break;
    }
    case Op::NF4Embedding: {
      const k::NF4View w{
          I(1),       I(2),      reinterpret_cast<const float*>(I(3)), float(a.scalar),
          a.shape[0], a.shape[1]};
      k::nf4_gather_rows<T>(w, I(0), in[0].numel(), Y);
      break;
    }
    case Op::SwiGLU:
      k::swiglu<T>(X(0), X(1), Y, in[0].numel());
      break;
    case Op::SwiGLUBackward:
      k::swiglu_backward<T>(X(0), X(1), X(2), Y, out[1].data<T>(), in[0].numel());
      break;
    case Op::AddRMSNorm: {
      const int64_t D = in[0].shape().back();
      k::add_rmsnorm_forward<T>(X(0), X(1), X(2), Y, out[1].data<T>(), in[0].numel() / D, D, a.eps);
      break;
    }
    case Op::RMSNormBackwardAdd: {
      const int64_t D = in[0].shape().back();
      k::rmsnorm_backward_add<T>(X(0), X(1), X(2), X(3), Y, out[1].data<T>(), in[0].numel() / D, D,
                                 a.eps);
      break;
    }
    case Op::Elementwise: {
      std::vector<const T*> xs;
      std::vector<int64_t> ns;
      for (size_t i = 0; i < in.size(); ++i) {
        xs.push_back(X(i));
        ns.push_back(in[i].numel());
      }
      k::elementwise_program<T>(k::decode_program(a.program), xs, ns, Y, out[0].numel());
      break;
    }
    case Op::FlashAttention:
    case Op::FlashAttentionBackward: {
      const Shape& qs = in[0].shape();
      const k::AttentionDims d{qs[0], qs[1], qs[2], in[1].dim(2), qs[3]};
      if (n.op == Op::FlashAttention) {
        const int32_t* docs = in.size() > 3 ? I(3) : nullptr;
        k::flash_attention_forward<T>(X(0), X(1), X(2), docs, Y, out[1].data<T>(), d, a.scalar);
      } else {
        const int32_t* docs = in.size() > 6 ? I(6) : nullptr;
        k::flash_attention_backward<T>(X(0), X(1), X(2), X(3), X(4), X(5), docs, Y,
                                       out[1].data<T>(), out[2].data<T>(), d, a.scalar);
      }
      break;
    }
    case Op::Dropout:
      k::dropout<T>(X(0), Y, in[0].numel(), a.scalar, uint64_t(uint32_t(I(1)[0])),
                    uint64_t(a.start));
      break;
    case Op::RowInvNorm:
      k::row_inv_norm<T>(X(0), Y, in[0].dim(0), in[0].dim(1));
      break;
    case Op::NF4MatMul:
    case Op::NF4MatMulBackward: {
      k::NF4View w{I(1),       I(2),      reinterpret_cast<const float*>(I(3)), float(a.scalar),
                   a.shape[0], a.shape[1]};
      if (n.op == Op::NF4MatMul)
        k::nf4_matmul<T>(w, X(0), in[0].dim(0), Y);
      else
        k::nf4_matmul_backward<T>(w, X(0), in[0].dim(0), Y);
      break;
    }
    case Op::LabelLogProbs:
      k::label_log_probs<T>(X(0), I(1), Y, in[0].dim(0), in[0].dim(1));
      break;
    case Op::LabelLogProbsBackward:
      k::label_log_probs_backward<T>(X(0), I(1), Y, out[0].dim(0), out[0].dim(1));
      break;
    case Op::RowSum: {
      const int64_t C = in[0].shape().back();
      k::row_sum<T>(X(0), Y, in[0].numel() / C, C);
      break;
    }
    case Op::LogSigmoid:
      k::log_sigmoid<T>(X(0), Y, in[0].numel());
      break;
    case Op::LogSigmoidBackward:
      k::log_sigmoid_backward<T>(X(0), X(1), Y, in[0].numel());
      break;
    case Op::Relu:
      k::relu<T>(X(0), Y, in[0].numel());
      break;
    case Op::ReluBackward:
      k::relu_backward<T>(X(0), X(1), Y, in[0].numel());
      break;
    case Op::FusedLinearLogProbs:
    case Op::FusedLinearLogProbsBackward: {
      const bool fwd = n.op == Op::FusedLinearLogProbs;
      const size_t hi = fwd ? 2 : 4;  // the head's first input
      const bool nf4 = in.size() == hi + 3;
      k::NF4View w{};
      k::LogProbHead<T> head;
      head.D = in[0].dim(1);
      if (nf4) {
        w = {I(hi),           I(hi + 1),  reinterpret_cast<const float*>(I(hi + 2)),
             float(a.scalar), a.shape[0], a.shape[1]};
        head.nf4 = &w;
        head.V = a.shape[0];
      } else if (in[hi].dtype() == DType::BF16) {
        head.bf16 = in[hi].data<uint16_t>();
        head.V = in[hi].dim(0);
      } else {
        head.W = X(hi);
        head.V = in[hi].dim(0);
      }
      if (fwd)
        k::fused_linear_log_probs<T>(X(0), I(1), head, in[0].dim(0), a.chunk_rows, Y,
                                     out[1].data<T>(), out[2].data<T>(),
                                     a.no_weight_grad ? out[3].data<T>() : nullptr);
      else if (a.no_weight_grad)  // x = E_p[W] of the forward
        k::fused_linear_log_probs_backward_frozen<T>(I(1), X(0), X(3), head, in[0].dim(0), Y);
      else
        k::fused_linear_log_probs_backward<T>(X(0), I(1), X(2), X(3), head, in[0].dim(0),
                                              a.chunk_rows, Y,
                                              out.size() > 1 ? out[1].data<T>() : nullptr);
      break;
    }
    case Op::FakeQuantize:
    case Op::FakeQuantizeBackward: {
      const bool fwd = n.op == Op::FakeQuantize;
      const k::FakeQuantSpec spec{k::FakeQuant(a.groups), a.len};
      const int64_t cols = in[0].shape().back(), rows = in[0].numel() / std::max<int64_t>(1, cols);
      const T* src = X(fwd ? 0 : 1);
      if (I(fwd ? 1 : 2)[0] == 0) {  // fake quantization off: identity, plain gradient
        if (Y != src) std::copy(src, src + out[0].numel(), Y);
      } else if (fwd) {
        k::fake_quantize_rows<T>(spec, X(0), Y, rows, cols);
      } else {
        k::fake_quantize_backward<T>(spec, X(0), X(1), Y, rows, cols);
      }
      break;
    }
    case Op::FakeQuantMatMul:
    case Op::FakeQuantMatMulBackward: {
      const bool fwd = n.op == Op::FakeQuantMatMul;
      const k::FakeQuantSpec spec{k::FakeQuant(a.groups), a.len};
      const int64_t N = in[0].dim(0), O = in[1].dim(0), K = in[1].dim(1);
      const bool on = I(2)[0] != 0;
      if constexpr (std::is_same_v<T, float>) {
        if (in[1].dtype() == DType::BF16) {  // a bf16 weight, widened tile by tile
          const uint16_t* w = in[1].data<uint16_t>();
          if (fwd && on)
            k::fake_quant_matmul_bf16(spec, w, X(0), N, O, K, Y);
          else if (on)
            k::fake_quant_matmul_backward_bf16(spec, w, X(0), N, O, K, Y);
          else if (fwd)
            k::gemm_bf16_weight(true, N, O, K, X(0), w, Y);
          else
            k::gemm_bf16_weight(false, N, K, O, X(0), w, Y);
          break;
        }
      }
      if (fwd && on)
        k::fake_quant_matmul<T>(spec, X(1), X(0), N, O, K, Y);
      else if (on)
        k::fake_quant_matmul_backward<T>(spec, X(1), X(0), N, O, K, Y);
      else if (fwd)
        k::gemm<T>(false, true, N, O, K, T(1), X(0), K, X(1), K, T(0), Y, O);
      else
        k::gemm<T>(false, false, N, K, O, T(1), X(0), O, X(1), K, T(0), Y, K);
      break;
    }
    case Op::KVCacheAttention: {
      const Shape& qs = in[0].shape();
      const k::KVCacheDims d{qs[0], qs[1], qs[2], in[1].dim(2), qs[3], in[3].dim(1)};
      // The caches are inputs the op extends in place (op.h).
      k::kv_cache_attention<T>(X(0), X(1), X(2), X(3), X(4), I(5)[0], I(6), Y, d, a.scalar);
      break;
    }
    default:
      throw Error(std::string("no kernel bound for op ") + op_name(n.op));
  }
}

}  // namespace

bool is_view_op(Op op) { return op == Op::Reshape; }

bool can_write_over_input(const Node& n, int input) {
  if (n.outputs.size() != 1 || input < 0 || input >= int(n.inputs.size())) return false;
  switch (n.op) {
    // Same-index elementwise loops (kernels/cpu/elementwise.cpp, peft_ops.cpp dropout). For
    // Add/Mul the planner's equal-size check excludes a broadcast second operand.
    case Op::Add:
    case Op::Mul:
    case Op::SiluBackward:  // dx[i] from x[i], dy[i]
      return true;
    case Op::Scale:
    case Op::Silu:
    case Op::Dropout:
      return input == 0;
    // kernels/cpu/fake_quant.cpp: a group's statistics are read before any of it is written.
    case Op::FakeQuantize:
      return input == 0;
    case Op::FakeQuantizeBackward:  // dx[i] from x's group (read into scratch) and dy[i]
      return input == 1;
    // Row kernels that read their row (max / sums / dot products) before writing it, and
    // then write element j from element j only: softmax.cpp, norm.cpp (forward only: the
    // RMSNorm backward reads dy and x again for dw after writing dx), rope.cpp (each lane
    // pair is read before it is written), attention_mask.cpp (copy or -inf per element).
    case Op::Softmax:
    case Op::LogSoftmax:
    case Op::RMSNorm:
    case Op::Rope:
    case Op::CausalMask:
    case Op::CausalMaskBackward:
      return input == 0;
    case Op::SoftmaxBackward:
    case Op::LogSoftmaxBackward:
      return true;
    // elementwise_program.cpp writes each block's result after reading the block's inputs;
    // only a same-size input can have the output's size.
    case Op::Elementwise:
      return true;
    default:
      return false;
  }
}

void run_f32_node_kernel(const Node& n, const std::vector<Tensor>& inputs,
                         std::vector<Tensor>& outputs) {
  run_typed<float>(n, inputs, outputs);
}

void run_node_kernel(const Graph& g, const Node& n, const std::vector<Tensor>& inputs,
                     std::vector<Tensor>& outputs, const NodeScratch& scratch) {
  switch (g.float_dtype()) {
    case DType::F64:
      return run_typed<double>(n, inputs, outputs);
    case DType::BF16:
      return run_bf16_node_kernel(g, n, inputs, outputs, scratch);
    default:
      return run_typed<float>(n, inputs, outputs);
  }
}

}  // namespace fusetune
