// Shape and dtype rules for every op (declared in graph.h as infer_types).
#include <algorithm>

#include "fusetune/graph/graph.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

[[noreturn]] void fail(Op op, const std::string& why) {
  throw Error(std::string("shape error in ") + op_name(op) + ": " + why);
}

bool is_suffix(const Shape& small, const Shape& big) {
  if (small.size() > big.size()) return false;
  return std::equal(small.begin(), small.end(), big.end() - small.size());
}

int norm_dim(Op op, int d, size_t rank) {
  int r = int(rank);
  int nd = d < 0 ? d + r : d;
  if (nd < 0 || nd >= r)
    fail(op, "dim " + std::to_string(d) + " out of range for rank " + std::to_string(r));
  return nd;
}

}  // namespace

// The rules, with every floating output typed as the graph's float dtype.
std::vector<TensorType> infer_float_types(const Graph& g, Op op, const std::vector<Value>& in,
                                          const Attrs& a) {
  auto arity = [&](size_t lo, size_t hi) {
    if (in.size() < lo || in.size() > hi)
      fail(op, "wrong number of inputs (" + std::to_string(in.size()) + ")");
  };
  auto T = [&](size_t i) -> const TensorType& { return g.type(in[i]); };
  auto S = [&](size_t i) -> const Shape& { return g.type(in[i]).shape; };
  const DType fd = g.float_dtype();
  auto need_float = [&](size_t i) {
    // A bf16 graph also holds fp32 values (bf16_storage_output); its kernels take either.
    if (T(i).dtype != fd && !(fd == DType::BF16 && T(i).dtype == DType::F32))
      fail(op, "input " + std::to_string(i) + " must be " + dtype_name(fd) + ", got " +
                   dtype_name(T(i).dtype));
  };
  auto need_i32 = [&](size_t i) {
    if (T(i).dtype != DType::I32) fail(op, "input " + std::to_string(i) + " must be I32 ids");
  };
  auto same = [&](size_t i, size_t j) {
    if (S(i) != S(j)) fail(op, "shapes differ: " + shape_str(S(i)) + " vs " + shape_str(S(j)));
  };

  switch (op) {
    case Op::Input:
    case Op::Param:
    case Op::Constant:
    case Op::Fill:
      fail(op, "leaves are created with Graph::input/param/constant/fill");

    case Op::MatMul: {
      arity(2, 2);
      need_float(0);
      need_float(1);
      const Shape &sa = S(0), &sb = S(1);
      if (sa.size() < 2 || sb.size() < 2) fail(op, "operands must have rank >= 2");
      if (sa.size() != sb.size())
        fail(op, "operands must have equal rank: " + shape_str(sa) + " x " + shape_str(sb));
      if (!std::equal(sa.begin(), sa.end() - 2, sb.begin()))
        fail(op, "batch dims differ: " + shape_str(sa) + " x " + shape_str(sb));
      int64_t m = a.trans_a ? sa[sa.size() - 1] : sa[sa.size() - 2];
      int64_t k1 = a.trans_a ? sa[sa.size() - 2] : sa[sa.size() - 1];
      int64_t k2 = a.trans_b ? sb[sb.size() - 1] : sb[sb.size() - 2];
      int64_t n = a.trans_b ? sb[sb.size() - 2] : sb[sb.size() - 1];
      if (k1 != k2)
        fail(op, "inner dims differ: " + shape_str(sa) + (a.trans_a ? "^T" : "") + " x " +
                     shape_str(sb) + (a.trans_b ? "^T" : ""));
      Shape out(sa.begin(), sa.end() - 2);
      out.push_back(m);
      out.push_back(n);
      return {{out, fd}};
    }
    case Op::Add:
    case Op::Mul: {
      arity(2, 2);
      need_float(0);
      need_float(1);
      if (!is_suffix(S(1), S(0)))
        fail(op, shape_str(S(1)) + " does not broadcast to " + shape_str(S(0)));
      return {{S(0), fd}};
    }
    case Op::Scale:
    case Op::Silu:
    case Op::Softmax:
    case Op::LogSoftmax:
      arity(1, 1);
      need_float(0);
      return {{S(0), fd}};
    case Op::SiluBackward:
    case Op::SoftmaxBackward:
    case Op::LogSoftmaxBackward:
      arity(2, 2);
      same(0, 1);
      return {{S(0), fd}};
    case Op::SumAll:
      arity(1, 1);
      need_float(0);
      return {{Shape{}, fd}};
    case Op::Expand:
      arity(1, 1);
      if (!S(0).empty()) fail(op, "input must be a scalar");
      return {{a.shape, fd}};
    case Op::SumToShape:
      arity(1, 1);
      if (!is_suffix(a.shape, S(0)))
        fail(op, shape_str(a.shape) + " is not a suffix of " + shape_str(S(0)));
      return {{a.shape, fd}};
    case Op::RMSNorm:
      arity(2, 2);
      if (S(1).size() != 1 || S(0).empty() || S(0).back() != S(1)[0])
        fail(op, "weight " + shape_str(S(1)) + " does not match " + shape_str(S(0)));
      return {{S(0), fd}};
    case Op::RMSNormBackward:
      arity(3, 3);
      same(0, 2);
      return {{S(0), fd}, {S(1), fd}};
    case Op::Rope: {
      arity(4, 4);
      const Shape& x = S(0);
      if (x.size() != 4) fail(op, "x must be [B, T, H, Dh], got " + shape_str(x));
      if (x[3] % 2) fail(op, "head dim must be even");
      if (S(1).size() != 2 || S(1)[1] != x[3] / 2 || S(2) != S(1))
        fail(op, "cos/sin tables must be [max_pos, Dh/2]");
      need_i32(3);
      if (S(3) != Shape{x[0], x[1]}) fail(op, "positions must be [B, T]");
      return {{x, fd}};
    }
    case Op::Nll:
      arity(2, 2);
      need_i32(1);
      if (S(0).size() != 2 || S(1) != Shape{S(0)[0]})
        fail(op, "expects logp [N, V] and labels [N], got " + shape_str(S(0)) + " and " +
                     shape_str(S(1)));
      return {{Shape{}, fd}};
    case Op::NllBackward:
      arity(2, 2);
      need_i32(1);
      if (!S(0).empty() || S(1).size() != 1) fail(op, "expects a scalar grad and labels [N]");
      return {{Shape{S(1)[0], a.dim0}, fd}};
    case Op::Embedding: {
      arity(2, 2);
      need_i32(1);
      if (S(0).size() != 2) fail(op, "table must be [V, D]");
      Shape out = S(1);
      out.push_back(S(0)[1]);
      return {{out, fd}};
    }
    case Op::EmbeddingBackward: {
      arity(2, 2);
      need_i32(1);
      return {{Shape{a.dim0, S(0).back()}, fd}};
    }
    case Op::CausalMask:
    case Op::CausalMaskBackward: {
      arity(1, 2);
      const Shape& s = S(0);
      if (s.size() != 4 || s[2] != s[3])
        fail(op, "scores must be [B, H, T, T], got " + shape_str(s));
      if (in.size() == 2) {
        need_i32(1);
        if (S(1) != Shape{s[0], s[2]}) fail(op, "doc_ids must be [B, T]");
      }
      return {{s, fd}};
    }
    case Op::RepeatHeads: {
      arity(1, 1);
      if (S(0).size() != 4) fail(op, "expects [B, KV, T, D]");
      Shape out = S(0);
      out[1] *= a.groups;
      return {{out, fd}};
    }
    case Op::RepeatHeadsBackward: {
      arity(1, 1);
      if (S(0).size() != 4 || S(0)[1] % a.groups)
        fail(op, "expects [B, H, T, D] with H divisible by groups");
      Shape out = S(0);
      out[1] /= a.groups;
      return {{out, fd}};
    }
    case Op::Reshape:
      arity(1, 1);
      if (shape_numel(a.shape) != T(0).numel())
        fail(op, "cannot view " + shape_str(S(0)) + " as " + shape_str(a.shape));
      return {{a.shape, T(0).dtype}};
    case Op::Transpose: {
      arity(1, 1);
      Shape out = S(0);
      int d0 = norm_dim(op, a.dim0, out.size()), d1 = norm_dim(op, a.dim1, out.size());
      std::swap(out[d0], out[d1]);
      return {{out, T(0).dtype}};
    }
    case Op::Slice: {
      arity(1, 1);
      Shape out = S(0);
      int d = norm_dim(op, a.dim0, out.size());
      if (a.start < 0 || a.len < 0 || a.start + a.len > out[d]) fail(op, "range out of bounds");
      out[d] = a.len;
      return {{out, T(0).dtype}};
    }
    case Op::SliceBackward: {
      arity(1, 1);
      return {{a.shape, fd}};
    }
    case Op::FusedLinearCrossEntropy: {
      arity(4, 5);
      if (S(0).size() != 2 || S(1).size() != 2 || S(0)[1] != S(1)[1])
        fail(op, "expects h [N, D] and W [V, D]");
      need_i32(2);
      if (S(2) != Shape{S(0)[0]}) fail(op, "labels must be [N]");
      if (in.size() == 5) {  // a fake-quantized head
        need_i32(4);
        if (a.len <= 0 || S(1)[1] % a.len != 0)
          fail(op, "the head's rows of " + std::to_string(S(1)[1]) +
                       " are not a whole number of groups of " + std::to_string(a.len));
      }
      if (a.no_weight_grad) return {{Shape{}, fd}, {S(0), fd}};
      return {{Shape{}, fd}, {S(0), fd}, {S(1), fd}};
    }
    case Op::SwiGLU:
      arity(2, 2);
      need_float(0);
      same(0, 1);
      return {{S(0), fd}};
    case Op::SwiGLUBackward:
      arity(3, 3);
      need_float(0);
      same(0, 1);
      same(0, 2);
      return {{S(0), fd}, {S(0), fd}};
    case Op::AddRMSNorm:
      arity(3, 3);
      need_float(0);
      same(0, 1);
      if (S(2).size() != 1 || S(0).empty() || S(0).back() != S(2)[0])
        fail(op, "weight " + shape_str(S(2)) + " does not match " + shape_str(S(0)));
      return {{S(0), fd}, {S(0), fd}};
    case Op::RMSNormBackwardAdd:
      arity(4, 4);
      need_float(0);
      same(0, 2);
      same(0, 3);
      if (S(1).size() != 1 || S(0).empty() || S(0).back() != S(1)[0])
        fail(op, "weight " + shape_str(S(1)) + " does not match " + shape_str(S(0)));
      return {{S(0), fd}, {S(1), fd}};
    case Op::Elementwise: {
      if (in.empty()) fail(op, "needs at least one input");
      if (a.program.empty()) fail(op, "empty program");
      const int64_t n = shape_numel(a.shape);
      for (size_t i = 0; i < in.size(); ++i) {
        need_float(i);
        const int64_t ni = T(i).numel();
        if (ni < 1 || n % ni != 0)
          fail(op, "input " + std::to_string(i) + " " + shape_str(S(i)) +
                       " does not repeat evenly over " + shape_str(a.shape));
      }
      return {{a.shape, fd}};
    }
    case Op::FlashAttention:
    case Op::FlashAttentionBackward: {
      const bool fwd = op == Op::FlashAttention;
      const size_t base = fwd ? 3 : 6;
      arity(base, base + 1);
      for (size_t i = 0; i < base; ++i) need_float(i);
      const Shape &q = S(0), &k = S(1);
      if (q.size() != 4 || k.size() != 4 || q[0] != k[0] || q[1] != k[1] || q[3] != k[3] ||
          k[2] < 1 || q[2] % k[2])
        fail(op, "expects q [B, T, H, hd] and k [B, T, KV, hd] with H a multiple of KV, got " +
                     shape_str(q) + " and " + shape_str(k));
      same(1, 2);
      const Shape lse{q[0], q[2], q[1]};
      if (!fwd) {
        same(0, 3);
        same(0, 5);
        if (S(4) != lse) fail(op, "lse must be " + shape_str(lse) + ", got " + shape_str(S(4)));
      }
      if (in.size() == base + 1) {
        need_i32(base);
        if (S(base) != Shape{q[0], q[1]}) fail(op, "doc_ids must be [B, T]");
      }
      if (fwd) return {{q, fd}, {lse, fd}};
      return {{q, fd}, {k, fd}, {k, fd}};
    }
    case Op::Dropout:
      arity(2, 2);
      need_float(0);
      need_i32(1);
      if (!S(1).empty()) fail(op, "the seed must be a scalar");
      if (a.scalar < 0 || a.scalar >= 1) fail(op, "p must be in [0, 1)");
      return {{S(0), fd}};
    case Op::RowInvNorm:
      arity(1, 1);
      need_float(0);
      if (S(0).size() != 2) fail(op, "expects a matrix [O, K], got " + shape_str(S(0)));
      return {{Shape{S(0)[0]}, fd}};
    case Op::NF4MatMul:
    case Op::NF4MatMulBackward: {
      arity(4, 4);
      need_float(0);
      for (size_t i = 1; i < 4; ++i) need_i32(i);
      if (a.shape.size() != 2) fail(op, "attrs.shape must be the weight's [O, K]");
      const bool fwd = op == Op::NF4MatMul;
      const int64_t in_dim = fwd ? a.shape[1] : a.shape[0], out_dim = fwd ? a.shape[0] : a.shape[1];
      if (S(0).size() != 2 || S(0)[1] != in_dim)
        fail(op, "input " + shape_str(S(0)) + " does not match the weight " + shape_str(a.shape));
      return {{Shape{S(0)[0], out_dim}, fd}};
    }
    case Op::FakeQuantize:
    case Op::FakeQuantizeBackward: {
      const bool fwd = op == Op::FakeQuantize;
      arity(fwd ? 2 : 3, fwd ? 2 : 3);
      need_float(0);
      if (!fwd) {
        need_float(1);
        if (S(1) != S(0)) fail(op, "dy must have x's shape " + shape_str(S(0)));
      }
      need_i32(fwd ? 1 : 2);
      if (S(0).empty() || a.len <= 0 || S(0).back() % a.len != 0)
        fail(op, "the last dim of " + shape_str(S(0)) + " is not a whole number of groups of " +
                     std::to_string(a.len));
      return {{S(0), fd}};
    }
    case Op::FakeQuantMatMul:
    case Op::FakeQuantMatMulBackward: {
      arity(3, 3);
      need_float(0);
      need_float(1);
      need_i32(2);
      if (S(1).size() != 2) fail(op, "W must be a matrix [O, K], got " + shape_str(S(1)));
      const bool fwd = op == Op::FakeQuantMatMul;
      const int64_t in_dim = fwd ? S(1)[1] : S(1)[0], out_dim = fwd ? S(1)[0] : S(1)[1];
      if (S(0).size() != 2 || S(0)[1] != in_dim)
        fail(op, "input " + shape_str(S(0)) + " does not match the weight " + shape_str(S(1)));
      if (a.len <= 0 || S(1)[1] % a.len != 0)
        fail(op, "the weight's rows of " + std::to_string(S(1)[1]) +
                     " are not a whole number of groups of " + std::to_string(a.len));
      return {{Shape{S(0)[0], out_dim}, fd}};
    }
    case Op::NF4Embedding: {
      arity(4, 4);
      for (size_t i = 0; i < 4; ++i) need_i32(i);
      if (a.shape.size() != 2) fail(op, "attrs.shape must be the table's [V, D]");
      Shape out = S(0);
      out.push_back(a.shape[1]);
      return {{out, fd}};
    }
    case Op::FusedNF4LinearCrossEntropy: {
      arity(6, 6);
      need_float(0);
      need_i32(1);
      for (size_t i = 3; i < 6; ++i) need_i32(i);
      if (a.shape.size() != 2) fail(op, "attrs.shape must be the head's [V, D]");
      if (S(0).size() != 2 || S(0)[1] != a.shape[1])
        fail(op,
             "expects h [N, D] for the head " + shape_str(a.shape) + ", got " + shape_str(S(0)));
      if (S(1) != Shape{S(0)[0]}) fail(op, "labels must be [N]");
      if (!S(2).empty()) fail(op, "the scale must be a scalar");
      return {{Shape{}, fd}, {S(0), fd}};
    }
    case Op::LabelLogProbs:
      arity(2, 2);
      need_float(0);
      need_i32(1);
      if (S(0).size() != 2 || S(1) != Shape{S(0)[0]})
        fail(op, "expects logp [N, V] and labels [N], got " + shape_str(S(0)) + " and " +
                     shape_str(S(1)));
      return {{S(1), fd}};
    case Op::LabelLogProbsBackward:
      arity(2, 2);
      need_float(0);
      need_i32(1);
      if (S(0).size() != 1 || S(1) != S(0)) fail(op, "expects dy [N] and labels [N]");
      if (a.dim0 < 1) fail(op, "attrs.dim0 must be the vocabulary size");
      return {{Shape{S(0)[0], a.dim0}, fd}};
    case Op::RowSum: {
      arity(1, 1);
      need_float(0);
      if (S(0).empty()) fail(op, "expects at least one dimension");
      Shape out(S(0).begin(), S(0).end() - 1);
      return {{out, fd}};
    }
    case Op::KVCacheAttention: {
      arity(7, 7);
      for (size_t i = 0; i < 5; ++i) need_float(i);
      need_i32(5);
      need_i32(6);
      const Shape &q = S(0), &k = S(1), &kc = S(3);
      if (q.size() != 4 || k.size() != 4 || kc.size() != 4 || k[0] != q[0] || k[1] != q[1] ||
          k[3] != q[3] || k[2] < 1 || q[2] % k[2] || kc[0] != q[0] || kc[2] != k[2] ||
          kc[3] != k[3] || kc[1] < q[1])
        fail(op,
             "expects q [B, T, H, hd], k, v [B, T, KV, hd] and caches [B, S, KV, hd] with S >= "
             "T and H a multiple of KV, got q " +
                 shape_str(q) + ", k " + shape_str(k) + ", cache " + shape_str(kc));
      same(1, 2);
      same(3, 4);
      if (!S(5).empty() || S(6) != Shape{q[0]})
        fail(op, "cache_pos must be a scalar and cache_start [B]");
      return {{q, fd}};
    }
    case Op::LogSigmoid:
    case Op::Relu:
      arity(1, 1);
      need_float(0);
      return {{S(0), fd}};
    case Op::LogSigmoidBackward:
    case Op::ReluBackward:
      arity(2, 2);
      need_float(0);
      need_float(1);
      same(0, 1);
      return {{S(0), fd}};
    case Op::FusedLinearLogProbs:
    case Op::FusedLinearLogProbsBackward: {
      const bool fwd = op == Op::FusedLinearLogProbs;
      const size_t head = fwd ? 2 : 4;  // index of the first head input
      arity(head + 1, head + 3);
      const bool nf4 = in.size() == head + 3;
      need_float(0);
      need_i32(1);
      Shape w = nf4 ? a.shape : S(head);
      if (nf4) {
        for (size_t i = head; i < head + 3; ++i) need_i32(i);
        if (w.size() != 2) fail(op, "attrs.shape must be the NF4 head's [V, D]");
      } else {
        need_float(head);
      }
      if (w.size() != 2 || S(0).size() != 2 || S(0)[1] != w[1])
        fail(op,
             "expects h [N, D] and a head [V, D], got " + shape_str(S(0)) + " and " + shape_str(w));
      const Shape rows{S(0)[0]};
      if (S(1) != rows) fail(op, "labels must be [N]");
      if (fwd && a.no_weight_grad) return {{rows, fd}, {rows, fd}, {rows, fd}, {S(0), fd}};
      if (fwd) return {{rows, fd}, {rows, fd}, {rows, fd}};
      need_float(2);
      need_float(3);
      if (S(2) != rows || S(3) != rows) fail(op, "lse and dlogp must be [N]");
      if (nf4 || a.no_weight_grad) return {{S(0), fd}};
      return {{S(0), fd}, {w, fd}};
    }
    case Op::kCount:
      break;
  }
  fail(op, "unknown op");
}

bool keeps_f32_in_bf16_graph(Op op, size_t output, const Shape& shape) {
  if (shape.empty()) return true;  // scalars: losses, sums and scales cost nothing in fp32
  switch (op) {
    case Op::FlashAttention:  // the rows' log-sum-exp: bf16 would put 0.4% errors into exp()
      return output == 1;
    case Op::FusedLinearLogProbs:  // per-token log-probs and their softmax statistics
      return output < 3;
    case Op::LabelLogProbs:  // per-token and per-sequence log-probs (preference losses)
    case Op::RowSum:
    case Op::LogSigmoid:
    case Op::LogSigmoidBackward:
    case Op::RowInvNorm:  // DoRA's per-row 1 / ||W + BA||
      return true;
    default:
      return false;
  }
}

std::vector<TensorType> infer_types(const Graph& g, Op op, const std::vector<Value>& in,
                                    const Attrs& a) {
  std::vector<TensorType> out = infer_float_types(g, op, in, a);
  if (g.float_dtype() != DType::BF16) return out;
  // fp32 stays fp32: an op whose floating inputs are all fp32, one of them not a scalar (the
  // preference losses' per-sequence arithmetic), has no reason to round its result. A scalar
  // alone (the loss seed expanded into a gradient) does not make a tensor fp32.
  bool f32_tensor = false, all_f32 = true;
  for (const Value& v : in)
    if (is_floating(g.type(v).dtype)) {
      all_f32 &= g.type(v).dtype == DType::F32;
      f32_tensor |= !g.type(v).shape.empty();
    }
  for (size_t k = 0; k < out.size(); ++k)
    if (out[k].dtype == DType::BF16 &&
        ((f32_tensor && all_f32) || keeps_f32_in_bf16_graph(op, k, out[k].shape)))
      out[k].dtype = DType::F32;
  return out;
}

}  // namespace fusetune
