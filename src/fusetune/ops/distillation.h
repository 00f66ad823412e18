#pragma once
// Knowledge distillation's divergence between the student's and the teacher's logits
// (kernels/cpu/divergence.h, losses/distillation.h), and both LM heads fused with it
// (kernels/cpu/fused_linear_divergence.h). One entry per op (graph/op_desc.h,
// docs/design.md §1). attrs.groups = the kernels::DivergenceKind, attrs.scalar = beta
// (generalized JSD), attrs.eps = the temperature.
#include <algorithm>
#include <array>
#include <bit>
#include <string>
#include <vector>

#include "fusetune/graph/op_desc.h"
#include "fusetune/kernels/cpu/divergence.h"
#include "fusetune/kernels/cpu/fused_linear_divergence.h"

namespace fusetune::ops {

inline kernels::DivergenceParams divergence_params(const Attrs& a) {
  return {kernels::DivergenceKind(a.groups), a.scalar, a.eps};
}

inline constexpr OpDesc kDivergence = {
    .op = Op::Divergence,
    .name = "divergence",
    .min_inputs = 3,
    .max_inputs = 3,
    .shape = [](const ShapeCheck& c) -> Types {
      c.need_float(0);
      c.need_float(1);
      c.need_i32(2);
      if (c.S(0).size() != 2 || c.S(1) != c.S(0) || c.S(2) != Shape{c.S(0)[0]})
        c.fail("expects student and teacher logits [N, V] and labels [N], got " +
               shape_str(c.S(0)) + ", " + shape_str(c.S(1)) + " and " + shape_str(c.S(2)));
      if (c.a.groups < 0 || c.a.groups > 2) c.fail("attrs.groups is not a divergence kind");
      return {{Shape{}, c.fd}};
    },
    // The teacher is a constant (torchtune runs it without gradients): only the student's
    // logits get one.
    .vjp =
        [](VjpContext& c) {
          c.dx[0] = c.op(Op::DivergenceBackward, {c.dy, c.in[0], c.in[1], c.in[2]}, c.a);
        },
    .gradcheck =
        [](GradcheckCase& t) {
          // Generalized JSD at beta 0.3 and temperature 2: the rule with every term.
          Tensor teacher = Tensor::empty({4, 5}, DType::F64);
          for (int64_t i = 0; i < 20; ++i) teacher.data<double>()[i] = 0.37 * double(i % 7) - 1;
          t.inputs.push_back({"teacher", teacher});
          Value tv = t.g.input("teacher", {4, 5}, DType::F64);
          Value labels = t.ids("labels", {4}, {2, -100, 0, 4});  // one row ignored
          Attrs a;
          a.groups = int64_t(kernels::DivergenceKind::GeneralizedJSD);
          a.scalar = 0.3;
          a.eps = 2.0;
          return t.g.add1(Op::Divergence, {t.param("student", {4, 5}, -3, 3), tv, labels}, a);
        },
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          c.Y[0] = T(kernels::divergence_sum<T>(c.X(0), c.X(1), c.I(2), c.in[0].dim(0),
                                                c.in[0].dim(1), divergence_params(c.a)));
        },
};

inline constexpr OpDesc kDivergenceBackward = {
    .op = Op::DivergenceBackward,
    .name = "divergence_backward",
    .min_inputs = 4,
    .max_inputs = 4,
    .shape = [](const ShapeCheck& c) -> Types {
      c.need_float(1);
      c.need_float(2);
      c.need_i32(3);
      if (!c.S(0).empty() || c.S(1).size() != 2 || c.S(2) != c.S(1) || c.S(3) != Shape{c.S(1)[0]})
        c.fail("expects a scalar grad, student and teacher logits [N, V] and labels [N]");
      return {{c.S(1), c.fd}};
    },
    .no_vjp = kBackwardOp,
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          kernels::divergence_backward<T>(c.X(0)[0], c.X(1), c.X(2), c.I(3), c.Y, c.in[1].dim(0),
                                          c.in[1].dim(1), divergence_params(c.a));
        },
};

// FusedLinearDivergence and its backward. Inputs (the backward's first is dy [2]):
//   h [N, D], the student's head: W [V, D] (dense or bf16) or, when attrs.shape = [V, D] is
//   set, an NF4 head's three I32 parts (codes, absmax codes, absmax scales; its offset's float
//   bits in attrs.start), then teacher_h [N, Dt], teacher_W [V, Dt], labels [N], and
//   optionally the head's LoRA term: A [r, D] and scale * B [V, r], then with attrs.dim0 = 1
//   the term's own input x [N, D] (lora_dropout: dropout(h)), with attrs.dim1 = 1 DoRA's
//   column scale c [V]. With attrs.len = K > 0 the teacher is its top-k instead: the two
//   teacher inputs are its ids [N, K] I32 and their log-probs [N, K] (no teacher head;
//   kernels/cpu/fused_linear_divergence.h).
// Outputs: the sums [2]; the backward's then dh, dW (a dense head without no_weight_grad),
// dA and dBs (with the LoRA term), dx, dc (with them).
struct LinearDivergenceLayout {
  size_t h = 0, head = 1, head_count = 1, teacher_h = 2, teacher_W = 3, labels = 4, lora = 0;
  size_t lora_x = 0, col_scale = 0;  // valid with has_lora_x, has_col_scale
  bool nf4 = false, has_lora = false, has_lora_x = false, has_col_scale = false;
  int64_t top_k = 0;  // > 0: the teacher inputs are its top-k ids and log-probs
  size_t extras() const { return size_t(has_lora_x) + size_t(has_col_scale); }
};
inline LinearDivergenceLayout linear_divergence_layout(Op op, const Attrs& a, size_t inputs) {
  LinearDivergenceLayout l;
  l.h = op == Op::FusedLinearDivergenceBackward ? 1 : 0;
  l.nf4 = !a.shape.empty();
  l.head = l.h + 1;
  l.head_count = l.nf4 ? 3 : 1;
  l.teacher_h = l.head + l.head_count;
  l.teacher_W = l.teacher_h + 1;
  l.labels = l.teacher_W + 1;
  l.lora = l.labels + 1;
  l.has_lora_x = a.dim0 == 1;
  l.has_col_scale = a.dim1 == 1;
  l.lora_x = l.lora + 2;
  l.col_scale = l.lora + 2 + size_t(l.has_lora_x);
  l.has_lora = inputs == l.lora + 2 + l.extras();
  l.top_k = a.len;
  return l;
}
// The NF4 offset travels as its float's bits (attrs.scalar is beta).
inline int64_t nf4_offset_bits(float offset) { return std::bit_cast<int32_t>(offset); }
inline float nf4_offset_of(const Attrs& a) { return std::bit_cast<float>(int32_t(a.start)); }
// Whether the backward has a dW output: a dense, trainable head.
inline bool linear_divergence_has_dW(const LinearDivergenceLayout& l, const Attrs& a) {
  return !l.nf4 && !a.no_weight_grad;
}

template <class T>
kernels::LinearDivergenceInputs<T> linear_divergence_inputs(const KernelArgs<T>& c,
                                                            kernels::NF4View& nf4) {
  const LinearDivergenceLayout l = linear_divergence_layout(c.n.op, c.a, c.in.size());
  kernels::LinearDivergenceInputs<T> in;
  // In a bf16 graph either head arrives as stored (reads_bf16), widened a tile at a time.
  const auto head = [&](size_t i, const T*& dense, const uint16_t*& bf16) {
    if (c.in[i].dtype() == DType::BF16)
      bf16 = c.in[i].template data<uint16_t>();
    else
      dense = c.X(i);
  };
  in.h = c.X(l.h);
  in.D = c.in[l.h].dim(1);
  if (l.nf4) {
    nf4 = {c.I(l.head),        c.I(l.head + 1), reinterpret_cast<const float*>(c.I(l.head + 2)),
           nf4_offset_of(c.a), c.a.shape[0],    c.a.shape[1]};
    in.W_nf4 = &nf4;
    in.V = c.a.shape[0];
  } else {
    head(l.head, in.W, in.W_bf16);
    in.V = c.in[l.head].dim(0);
  }
  if (l.top_k > 0) {
    in.teacher_topk_ids = c.I(l.teacher_h);
    in.teacher_topk_logprobs = c.X(l.teacher_W);
    in.teacher_top_k = l.top_k;
  } else {
    in.teacher_h = c.X(l.teacher_h);
    head(l.teacher_W, in.teacher_W, in.teacher_W_bf16);
    in.teacher_D = c.in[l.teacher_h].dim(1);
  }
  in.labels = c.I(l.labels);
  in.N = c.in[l.h].dim(0);
  if (l.has_lora) {
    in.lora_A = c.X(l.lora);
    in.lora_B = c.X(l.lora + 1);
    in.lora_rank = c.in[l.lora].dim(0);
    if (l.has_lora_x) in.lora_x = c.X(l.lora_x);
    if (l.has_col_scale) in.col_scale = c.X(l.col_scale);
  }
  in.chunk_rows = c.a.chunk_rows;
  in.divergence = divergence_params(c.a);
  return in;
}

inline constexpr auto kLinearDivergenceShape = [](const ShapeCheck& c) -> Types {
  const LinearDivergenceLayout l = linear_divergence_layout(c.op, c.a, c.in.size());
  if ((c.in.size() != l.lora || l.extras() > 0) && !l.has_lora)
    c.fail("expects " + std::to_string(l.lora) + " inputs, or " +
           std::to_string(l.lora + 2 + l.extras()) +
           " with a LoRA term (and its own input, DoRA's scale: attrs.dim0, dim1)");
  c.need_float(l.h);
  if (l.top_k > 0)
    c.need_i32(l.teacher_h);
  else
    c.need_float(l.teacher_h);
  c.need_float(l.teacher_W);
  Shape W;
  if (l.nf4) {
    for (size_t i = l.head; i < l.head + 3; ++i) c.need_i32(i);
    W = c.a.shape;
    if (W.size() != 2) c.fail("attrs.shape must be the NF4 head's [V, D]");
  } else {
    c.need_float(l.head);
    W = c.S(l.head);
  }
  c.need_i32(l.labels);
  const Shape &hs = c.S(l.h), &ht = c.S(l.teacher_h), &Wt = c.S(l.teacher_W);
  if (hs.size() != 2 || W.size() != 2 || W[1] != hs[1] || c.S(l.labels) != Shape{hs[0]})
    c.fail("expects h [N, D], the student's head [V, D] and labels [N], got " + shape_str(hs) +
           ", " + shape_str(W) + " and " + shape_str(c.S(l.labels)));
  if (l.top_k > 0) {
    if (ht != Shape{hs[0], l.top_k} || Wt != ht || l.top_k > W[0])
      c.fail("expects the teacher's top-k ids and log-probs [N, " + std::to_string(l.top_k) +
             "] (k at most the vocabulary), got " + shape_str(ht) + " and " + shape_str(Wt));
  } else if (ht.size() != 2 || Wt.size() != 2 || Wt[1] != ht[1] || ht[0] != hs[0] ||
             Wt[0] != W[0]) {
    c.fail("expects teacher_h [N, Dt] and teacher_W [V, Dt] for h " + shape_str(hs) +
           " and the head " + shape_str(W) + ", got " + shape_str(ht) + " and " + shape_str(Wt));
  }
  if (l.has_lora) {
    c.need_float(l.lora);
    c.need_float(l.lora + 1);
    const Shape &A = c.S(l.lora), &B = c.S(l.lora + 1);
    if (A.size() != 2 || A[1] != hs[1] || B != Shape{W[0], A[0]})
      c.fail("expects the LoRA term's A [r, D] and B [V, r], got " + shape_str(A) + " and " +
             shape_str(B));
    if (l.has_lora_x) {
      c.need_float(l.lora_x);
      if (c.S(l.lora_x) != hs)
        c.fail("expects the LoRA term's input x like h " + shape_str(hs) + ", got " +
               shape_str(c.S(l.lora_x)));
    }
    if (l.has_col_scale) {
      c.need_float(l.col_scale);
      if (c.S(l.col_scale) != Shape{W[0]})
        c.fail("expects DoRA's column scale [V], got " + shape_str(c.S(l.col_scale)));
    }
  }
  if (c.a.groups < 0 || c.a.groups > 2) c.fail("attrs.groups is not a divergence kind");
  if (!(c.a.eps > 0) || c.a.scalar < 0 || c.a.scalar > 1)
    c.fail("the temperature (attrs.eps) must be > 0 and beta (attrs.scalar) in [0, 1]");
  if (c.a.chunk_rows < 1) c.fail("attrs.chunk_rows must be at least 1");
  Types out{{Shape{2}, c.fd}};
  if (l.h == 0) return out;
  if (c.S(0) != Shape{2}) c.fail("dy must be [2]: the gradients of ce_sum and kd_sum");
  out.push_back({hs, c.fd});
  if (linear_divergence_has_dW(l, c.a)) out.push_back({W, c.fd});
  if (l.has_lora) {
    out.push_back({c.S(l.lora), c.fd});
    out.push_back({c.S(l.lora + 1), c.fd});
  }
  if (l.has_lora_x) out.push_back({hs, c.fd});
  if (l.has_col_scale) out.push_back({Shape{W[0]}, c.fd});
  return out;
};

inline constexpr auto kLinearDivergenceKernel = []<class T>(const KernelArgs<T>& c) {
  kernels::NF4View nf4{};
  const kernels::LinearDivergenceInputs<T> in = linear_divergence_inputs(c, nf4);
  std::array<double, 2> sums;
  if (c.n.op == Op::FusedLinearDivergence) {
    sums = kernels::fused_linear_divergence<T>(in, nullptr);
  } else {
    const LinearDivergenceLayout l = linear_divergence_layout(c.n.op, c.a, c.in.size());
    kernels::LinearDivergenceGrads<T> g;
    g.dce = double(c.X(0)[0]);
    g.dkd = double(c.X(0)[1]);
    size_t o = 1;
    g.dh = c.out[o++].template data<T>();
    if (linear_divergence_has_dW(l, c.a)) g.dW = c.out[o++].template data<T>();
    if (l.has_lora) {
      g.dA = c.out[o++].template data<T>();
      g.dB = c.out[o++].template data<T>();
    }
    if (l.has_lora_x) g.d_lora_x = c.out[o++].template data<T>();
    if (l.has_col_scale) g.d_col_scale = c.out[o++].template data<T>();
    sums = kernels::fused_linear_divergence<T>(in, &g);
  }
  c.Y[0] = T(sums[0]);
  c.Y[1] = T(sums[1]);
};

inline constexpr auto kLinearDivergenceScratch = [](const Graph& g, const Node& n) -> int64_t {
  const LinearDivergenceLayout l = linear_divergence_layout(n.op, n.attrs, n.inputs.size());
  const int64_t N = g.shape(n.inputs[l.h])[0];
  const int64_t C = std::max<int64_t>(1, std::min(n.attrs.chunk_rows, N));
  kernels::DivergenceScratchShape s;
  s.chunk_rows = C;
  s.D = g.shape(n.inputs[l.h])[1];
  s.teacher_D = l.top_k > 0 ? 0 : g.shape(n.inputs[l.teacher_h])[1];
  s.V = l.nf4 ? n.attrs.shape[0] : g.shape(n.inputs[l.head])[0];
  s.elem_bytes = int64_t(dtype_size(g.compute_dtype()));
  s.grads = l.h == 1;
  s.student_nf4 = l.nf4;
  s.student_bf16 = !l.nf4 && g.type(n.inputs[l.head]).dtype == DType::BF16;
  s.teacher_bf16 = l.top_k == 0 && g.type(n.inputs[l.teacher_W]).dtype == DType::BF16;
  s.lora_rank = l.has_lora ? g.shape(n.inputs[l.lora])[0] : 0;
  s.lora_x = l.has_lora_x;
  s.col_scale = l.has_col_scale;
  return kernels::fused_divergence_scratch_bytes(s);
};

// Both dense heads are read as stored: a bf16 head is widened a tile of rows at a time.
inline constexpr auto kLinearDivergenceReadsBf16 = [](const Node& n, size_t input) {
  const LinearDivergenceLayout l = linear_divergence_layout(n.op, n.attrs, n.inputs.size());
  return (input == l.head && !l.nf4) || (input == l.teacher_W && l.top_k == 0);
};

inline constexpr OpDesc kFusedLinearDivergence = {
    .op = Op::FusedLinearDivergence,
    .name = "fused_linear_divergence",
    .min_inputs = 5,
    .max_inputs = 11,  // an NF4 head's 3 parts instead of W, a LoRA term's A, B, x and c
    .shape = kLinearDivergenceShape,
    // The teacher (its hidden states and head) is a constant: only the student's hidden
    // states and head get gradients, from one backward sweep that recomputes both chunks of
    // logits (compile/fuse_linear_divergence.h merges it with this forward under
    // `compile: true`).
    .vjp =
        [](VjpContext& c) {
          const LinearDivergenceLayout l = linear_divergence_layout(c.n.op, c.a, c.in.size());
          Attrs a = c.a;
          a.no_weight_grad = l.nf4 || !c.need[l.head];
          std::vector<Value> in{c.dy};
          in.insert(in.end(), c.in.begin(), c.in.end());
          const std::vector<Value> f = c.g.add(Op::FusedLinearDivergenceBackward, in, a);
          size_t o = 1;
          c.dx[0] = f[o++];
          if (!a.no_weight_grad) c.dx[l.head] = f[o++];
          if (l.has_lora) {
            c.dx[l.lora] = f[o++];
            c.dx[l.lora + 1] = f[o++];
          }
          if (l.has_lora_x) c.dx[l.lora_x] = f[o++];
          if (l.has_col_scale) c.dx[l.col_scale] = f[o++];
        },
    .gradcheck =
        [](GradcheckCase& t) {
          // Generalized JSD at beta 0.3, temperature 2, over chunks of 2 of 5 tokens (one
          // ignored): every term of the rule, and a last chunk that is not full; the student's
          // head with a rank-2 LoRA term reading its own input x (lora_dropout's) and DoRA's
          // column scale c (the gradients of h, W, A, B, x and c).
          Tensor th = Tensor::empty({5, 2}, DType::F64), tw = Tensor::empty({7, 2}, DType::F64);
          for (int64_t i = 0; i < 10; ++i) th.data<double>()[i] = 0.37 * double(i % 7) - 1;
          for (int64_t i = 0; i < 14; ++i) tw.data<double>()[i] = 0.29 * double(i % 5) - 0.6;
          t.inputs.push_back({"teacher_h", th});
          t.inputs.push_back({"teacher_W", tw});
          Value labels = t.ids("labels", {5}, {2, -100, 0, 6, 3});
          Attrs a;
          a.groups = int64_t(kernels::DivergenceKind::GeneralizedJSD);
          a.scalar = 0.3;
          a.eps = 2.0;
          a.chunk_rows = 2;
          a.dim0 = a.dim1 = 1;
          return t.g.add1(Op::FusedLinearDivergence,
                          {t.param("h", {5, 3}, -2, 2), t.param("W", {7, 3}, -1, 1),
                           t.g.input("teacher_h", {5, 2}, DType::F64),
                           t.g.input("teacher_W", {7, 2}, DType::F64), labels,
                           t.param("lora_A", {2, 3}, -1, 1), t.param("lora_B", {7, 2}, -1, 1),
                           t.param("lora_x", {5, 3}, -2, 2), t.param("col_scale", {7}, 0.5, 1.5)},
                          a);
        },
    .kernel = kLinearDivergenceKernel,
    .keeps_f32 = [](size_t output) { return output == 0; },  // the sums, not rounded to bf16
    .reads_bf16 = kLinearDivergenceReadsBf16,
    .scratch_bytes = kLinearDivergenceScratch,
};

inline constexpr OpDesc kFusedLinearDivergenceBackward = {
    .op = Op::FusedLinearDivergenceBackward,
    .name = "fused_linear_divergence_backward",
    .min_inputs = 6,
    .max_inputs = 12,
    .shape = kLinearDivergenceShape,
    .no_vjp = kBackwardOp,
    .kernel = kLinearDivergenceKernel,
    .keeps_f32 = [](size_t output) { return output == 0; },  // the sums, not rounded to bf16
    .reads_bf16 = kLinearDivergenceReadsBf16,
    .scratch_bytes = kLinearDivergenceScratch,
};

inline constexpr const OpDesc* kDistillationOps[] = {
    &kDivergence, &kDivergenceBackward, &kFusedLinearDivergence, &kFusedLinearDivergenceBackward};

}  // namespace fusetune::ops
