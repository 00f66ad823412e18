#pragma once
// Attention: RoPE, masks, GQA head repetition, flash attention and the decode KV-cache attention.
// One entry per op (graph/op_desc.h, docs/design.md §1): to add an op, copy a neighbour's
// entry and list it in the family's ops at the end of this file.
#include <omp.h>

#include <cmath>

#include "fusetune/graph/op_desc.h"
#include "fusetune/kernels/cpu/flash_attention.h"
#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/kernels/cpu/kv_cache_attention.h"

namespace fusetune::ops {

namespace k = kernels;

inline constexpr OpDesc kRope = {
    .op = Op::Rope,
    .name = "rope",
    .min_inputs = 4,
    .max_inputs = 4,
    .shape = [](const ShapeCheck& c) -> Types {
      const Shape& x = c.S(0);
      if (x.size() != 4) c.fail("x must be [B, T, H, Dh], got " + shape_str(x));
      if (x[3] % 2) c.fail("head dim must be even");
      if (c.S(1).size() != 2 || c.S(1)[1] != x[3] / 2 || c.S(2) != c.S(1))
        c.fail("cos/sin tables must be [max_pos, Dh/2]");
      c.need_i32(3);
      if (c.S(3) != Shape{x[0], x[1]}) c.fail("positions must be [B, T]");
      return {{x, c.fd}};
    },
    .vjp =
        [](VjpContext& c) {
          Attrs at;
          at.inverse = !c.a.inverse;
          c.dx[0] = c.op(Op::Rope, {c.dy, c.in[1], c.in[2], c.in[3]}, at);
        },
    .gradcheck =
        [](GradcheckCase& t) {
          // Real rotations (cos^2 + sin^2 = 1) at positions [B, T].
          Tensor cos = Tensor::empty({5, 3}, DType::F64), sin = Tensor::empty({5, 3}, DType::F64);
          for (int64_t i = 0; i < cos.numel(); ++i) {
            cos.data<double>()[i] = std::cos(double(i) * 1.3);
            sin.data<double>()[i] = std::sin(double(i) * 1.3);
          }
          return t.g.add1(Op::Rope,
                          {t.param("x", {2, 3, 2, 6}), t.g.constant(cos, "cos"),
                           t.g.constant(sin, "sin"), t.ids("pos", {2, 3}, {0, 1, 2, 4, 0, 3})});
        },
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          const Shape& s = c.in[0].shape();
          k::rope<T>(c.X(0), c.X(1), c.X(2), c.I(3), c.Y, s[0], s[1], s[2], s[3], c.a.inverse);
        },
    .in_place = InPlace::FirstInput,  // rope.cpp reads each lane pair before writing it
};

// The shape rule of CausalMask, CausalMaskBackward.
inline constexpr auto kCausalMaskShape = [](const ShapeCheck& c) -> Types {
  const Shape& s = c.S(0);
  if (s.size() != 4 || s[2] != s[3]) c.fail("scores must be [B, H, T, T], got " + shape_str(s));
  if (c.in.size() == 2) {
    c.need_i32(1);
    if (c.S(1) != Shape{s[0], s[2]}) c.fail("doc_ids must be [B, T]");
  }
  return {{s, c.fd}};
};

// The kernel of CausalMask, CausalMaskBackward.
inline constexpr auto kCausalMaskKernel = []<class T>(const KernelArgs<T>& c) {
  const Shape& s = c.in[0].shape();
  const int32_t* docs = c.in.size() > 1 ? c.I(1) : nullptr;
  if (c.n.op == Op::CausalMask)
    k::causal_mask<T>(c.X(0), docs, c.Y, s[0], s[1], s[2], c.a.window);
  else
    k::causal_mask_backward<T>(c.X(0), docs, c.Y, s[0], s[1], s[2], c.a.window);
};

inline constexpr OpDesc kCausalMask = {
    .op = Op::CausalMask,
    .name = "causal_mask",
    .min_inputs = 1,
    .max_inputs = 2,
    .shape = kCausalMaskShape,
    .vjp =
        [](VjpContext& c) {
          std::vector<Value> args{c.dy};
          if (c.in.size() == 2) args.push_back(c.in[1]);
          c.dx[0] = c.op(Op::CausalMaskBackward, args, c.a);
        },
    .gradcheck =
        [](GradcheckCase& t) {
          // Masked scores are -inf: the softmax after the mask keeps the loss finite. A window
          // of 3 also masks key 0 for query 3.
          Value docs = t.ids("docs", {2, 4}, {0, 0, 1, 1, 0, 0, 0, 0});
          Attrs at;
          at.window = 3;
          Value masked = t.g.add1(Op::CausalMask, {t.param("s", {2, 2, 4, 4}, -2, 2), docs}, at);
          return t.g.add1(Op::Softmax, {masked});
        },
    .kernel = kCausalMaskKernel,
    .in_place = InPlace::FirstInput,  // attention_mask.cpp: a copy or -inf per element
};

inline constexpr OpDesc kCausalMaskBackward = {
    .op = Op::CausalMaskBackward,
    .name = "causal_mask_backward",
    .min_inputs = 1,
    .max_inputs = 2,
    .shape = kCausalMaskShape,
    .no_vjp = kBackwardOp,
    .kernel = kCausalMaskKernel,
    .in_place = InPlace::FirstInput,  // attention_mask.cpp: a copy or -inf per element
};

inline constexpr OpDesc kRepeatHeads = {
    .op = Op::RepeatHeads,
    .name = "repeat_heads",
    .min_inputs = 1,
    .max_inputs = 1,
    .shape = [](const ShapeCheck& c) -> Types {
      if (c.S(0).size() != 4) c.fail("expects [B, KV, T, D]");
      Shape out = c.S(0);
      out[1] *= c.a.groups;
      return {{out, c.fd}};
    },
    .vjp =
        [](VjpContext& c) {
          Attrs at;
          at.groups = c.a.groups;
          c.dx[0] = c.op(Op::RepeatHeadsBackward, {c.dy}, at);
        },
    .gradcheck =
        [](GradcheckCase& t) {
          Attrs at;
          at.groups = 3;
          return t.g.add1(Op::RepeatHeads, {t.param("x", {2, 2, 3, 4})}, at);
        },
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          const Shape& s = c.in[0].shape();
          k::repeat_heads<T>(c.X(0), c.Y, s[0], s[1], c.a.groups, s[2] * s[3]);
        },
};

inline constexpr OpDesc kRepeatHeadsBackward = {
    .op = Op::RepeatHeadsBackward,
    .name = "repeat_heads_backward",
    .min_inputs = 1,
    .max_inputs = 1,
    .shape = [](const ShapeCheck& c) -> Types {
      if (c.S(0).size() != 4 || c.S(0)[1] % c.a.groups)
        c.fail("expects [B, H, T, D] with H divisible by groups");
      Shape out = c.S(0);
      out[1] /= c.a.groups;
      return {{out, c.fd}};
    },
    .no_vjp = kBackwardOp,
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          const Shape& s = c.out[0].shape();
          k::repeat_heads_backward<T>(c.X(0), c.Y, s[0], s[1], c.a.groups, s[2] * s[3]);
        },
};

// Per-thread score tiles (and, backward, the rows' do.o sums).
inline constexpr auto kFlashAttentionScratch = [](const Graph& g, const Node& n) -> int64_t {
  const int64_t elem = int64_t(dtype_size(g.compute_dtype()));
  const Shape& q = g.shape(n.inputs[0]);
  const kernels::AttentionDims d{q[0], q[1],           q[2],           g.shape(n.inputs[1])[2],
                                 q[3], n.attrs.window, n.attrs.softcap};
  return kernels::flash_attention_workspace_bytes(d, elem, n.op == Op::FlashAttentionBackward,
                                                  omp_get_max_threads());
};

// The shape rule of FlashAttention, FlashAttentionBackward.
inline constexpr auto kFlashAttentionShape = [](const ShapeCheck& c) -> Types {
  const bool fwd = c.op == Op::FlashAttention;
  const size_t base = fwd ? 3 : 6;
  for (size_t i = 0; i < base; ++i) c.need_float(i);
  const Shape &q = c.S(0), &k = c.S(1);
  if (q.size() != 4 || k.size() != 4 || q[0] != k[0] || q[1] != k[1] || q[3] != k[3] || k[2] < 1 ||
      q[2] % k[2])
    c.fail("expects q [B, T, H, hd] and k [B, T, KV, hd] with H a multiple of KV, got " +
           shape_str(q) + " and " + shape_str(k));
  c.same(1, 2);
  const Shape lse{q[0], q[2], q[1]};
  if (!fwd) {
    c.same(0, 3);
    c.same(0, 5);
    if (c.S(4) != lse) c.fail("lse must be " + shape_str(lse) + ", got " + shape_str(c.S(4)));
  }
  if (c.in.size() == base + 1) {
    c.need_i32(base);
    if (c.S(base) != Shape{q[0], q[1]}) c.fail("doc_ids must be [B, T]");
  }
  if (fwd) return {{q, c.fd}, {lse, c.fd}};
  return {{q, c.fd}, {k, c.fd}, {k, c.fd}};
};

// The kernel of FlashAttention, FlashAttentionBackward.
inline constexpr auto kFlashAttentionKernel = []<class T>(const KernelArgs<T>& c) {
  const Shape& qs = c.in[0].shape();
  const k::AttentionDims d{qs[0], qs[1], qs[2], c.in[1].dim(2), qs[3], c.a.window, c.a.softcap};
  if (c.n.op == Op::FlashAttention) {
    const int32_t* docs = c.in.size() > 3 ? c.I(3) : nullptr;
    k::flash_attention_forward<T>(c.X(0), c.X(1), c.X(2), docs, c.Y, c.out[1].template data<T>(), d,
                                  c.a.scalar);
  } else {
    const int32_t* docs = c.in.size() > 6 ? c.I(6) : nullptr;
    k::flash_attention_backward<T>(c.X(0), c.X(1), c.X(2), c.X(3), c.X(4), c.X(5), docs, c.Y,
                                   c.out[1].template data<T>(), c.out[2].template data<T>(), d,
                                   c.a.scalar);
  }
};

inline constexpr OpDesc kFlashAttention = {
    .op = Op::FlashAttention,
    .name = "flash_attention",
    .min_inputs = 3,
    .max_inputs = 4,  // q, k, v [, doc_ids]
    .shape = kFlashAttentionShape,
    .no_vjp = kFusedAfterAutodiff,
    .kernel = kFlashAttentionKernel,
    // The rows' log-sum-exp: bf16 would put 0.4% errors into exp().
    .keeps_f32 = [](size_t output) { return output == 1; },
    .scratch_bytes = kFlashAttentionScratch,
};

inline constexpr OpDesc kFlashAttentionBackward = {
    .op = Op::FlashAttentionBackward,
    .name = "flash_attention_backward",
    .min_inputs = 6,
    .max_inputs = 7,  // q, k, v, o, lse, do [, doc_ids]
    .shape = kFlashAttentionShape,
    .no_vjp = kBackwardOp,
    .kernel = kFlashAttentionKernel,
    .scratch_bytes = kFlashAttentionScratch,
};

inline constexpr OpDesc kKVCacheAttention = {
    .op = Op::KVCacheAttention,
    .name = "kv_cache_attention",
    .min_inputs = 7,
    .max_inputs = 7,
    .shape = [](const ShapeCheck& c) -> Types {
      for (size_t i = 0; i < 5; ++i) c.need_float(i);
      c.need_i32(5);
      c.need_i32(6);
      const Shape &q = c.S(0), &k = c.S(1), &kc = c.S(3);
      if (q.size() != 4 || k.size() != 4 || kc.size() != 4 || k[0] != q[0] || k[1] != q[1] ||
          k[3] != q[3] || k[2] < 1 || q[2] % k[2] || kc[0] != q[0] || kc[2] != k[2] ||
          kc[3] != k[3] || kc[1] < q[1])
        c.fail(
            "expects q [B, T, H, hd], k, v [B, T, KV, hd] and caches [B, S, KV, hd] with S >= "
            "T and H a multiple of KV, got q " +
            shape_str(q) + ", k " + shape_str(k) + ", cache " + shape_str(kc));
      c.same(1, 2);
      c.same(3, 4);
      if (!c.S(5).empty() || c.S(6) != Shape{q[0]})
        c.fail("cache_pos must be a scalar and cache_start [B]");
      return {{q, c.fd}};
    },
    .no_vjp = "generation only: decode graphs have no backward",
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          const Shape& qs = c.in[0].shape();
          const k::KVCacheDims d{qs[0], qs[1],          qs[2],      c.in[1].dim(2),
                                 qs[3], c.in[3].dim(1), c.a.window, c.a.softcap};
          // The caches are inputs the op extends in place (op.h).
          k::kv_cache_attention<T>(c.X(0), c.X(1), c.X(2), c.X(3), c.X(4), c.I(5)[0], c.I(6), c.Y,
                                   d, c.a.scalar);
        },
};

inline constexpr const OpDesc* kAttentionOps[] = {&kRope,
                                                  &kCausalMask,
                                                  &kCausalMaskBackward,
                                                  &kRepeatHeads,
                                                  &kRepeatHeadsBackward,
                                                  &kFlashAttention,
                                                  &kFlashAttentionBackward,
                                                  &kKVCacheAttention};

}  // namespace fusetune::ops
