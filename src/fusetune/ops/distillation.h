#pragma once
// Knowledge distillation's divergence between the student's and the teacher's logits
// (kernels/cpu/divergence.h, losses/distillation.h), and both LM heads fused with it
// (kernels/cpu/fused_linear_divergence.h). One entry per op (graph/op_desc.h,
// docs/design.md §1). attrs.groups = the kernels::DivergenceKind, attrs.scalar = beta
// (generalized JSD), attrs.eps = the temperature.
#include <algorithm>
#include <array>

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

// FusedLinearDivergence and its backward: input index of the student's hidden states (the
// backward's first input is dy).
inline constexpr size_t linear_divergence_first(Op op) {
  return op == Op::FusedLinearDivergenceBackward ? 1 : 0;
}

template <class T>
kernels::LinearDivergenceInputs<T> linear_divergence_inputs(const KernelArgs<T>& c) {
  const size_t h = linear_divergence_first(c.n.op);
  kernels::LinearDivergenceInputs<T> in;
  // In a bf16 graph either head arrives as stored (reads_bf16), widened a tile at a time.
  const auto head = [&](size_t i, const T*& dense, const uint16_t*& bf16) {
    if (c.in[i].dtype() == DType::BF16)
      bf16 = c.in[i].template data<uint16_t>();
    else
      dense = c.X(i);
  };
  in.h = c.X(h);
  head(h + 1, in.W, in.W_bf16);
  in.D = c.in[h].dim(1);
  in.teacher_h = c.X(h + 2);
  head(h + 3, in.teacher_W, in.teacher_W_bf16);
  in.teacher_D = c.in[h + 2].dim(1);
  in.labels = c.I(h + 4);
  in.N = c.in[h].dim(0);
  in.V = c.in[h + 1].dim(0);
  in.chunk_rows = c.a.chunk_rows;
  in.divergence = divergence_params(c.a);
  return in;
}

inline constexpr auto kLinearDivergenceShape = [](const ShapeCheck& c) -> Types {
  const size_t h = linear_divergence_first(c.op);
  for (size_t i = h; i < h + 4; ++i) c.need_float(i);
  c.need_i32(h + 4);
  const Shape &hs = c.S(h), &W = c.S(h + 1), &ht = c.S(h + 2), &Wt = c.S(h + 3);
  if (hs.size() != 2 || W.size() != 2 || ht.size() != 2 || Wt.size() != 2 || W[1] != hs[1] ||
      Wt[1] != ht[1] || ht[0] != hs[0] || Wt[0] != W[0] || c.S(h + 4) != Shape{hs[0]})
    c.fail("expects h [N, D], W [V, D], teacher_h [N, Dt], teacher_W [V, Dt] and labels [N], got " +
           shape_str(hs) + ", " + shape_str(W) + ", " + shape_str(ht) + ", " + shape_str(Wt) +
           " and " + shape_str(c.S(h + 4)));
  if (c.a.groups < 0 || c.a.groups > 2) c.fail("attrs.groups is not a divergence kind");
  if (!(c.a.eps > 0) || c.a.scalar < 0 || c.a.scalar > 1)
    c.fail("the temperature (attrs.eps) must be > 0 and beta (attrs.scalar) in [0, 1]");
  if (c.a.chunk_rows < 1) c.fail("attrs.chunk_rows must be at least 1");
  const Types sums{{Shape{2}, c.fd}};
  if (h == 0) return sums;
  if (c.S(0) != Shape{2}) c.fail("dy must be [2]: the gradients of ce_sum and kd_sum");
  if (c.a.no_weight_grad) return {{Shape{2}, c.fd}, {hs, c.fd}};
  return {{Shape{2}, c.fd}, {hs, c.fd}, {W, c.fd}};
};

inline constexpr auto kLinearDivergenceKernel = []<class T>(const KernelArgs<T>& c) {
  const kernels::LinearDivergenceInputs<T> in = linear_divergence_inputs(c);
  std::array<double, 2> sums;
  if (c.n.op == Op::FusedLinearDivergence) {
    sums = kernels::fused_linear_divergence<T>(in, nullptr);
  } else {
    kernels::LinearDivergenceGrads<T> g;
    g.dce = double(c.X(0)[0]);
    g.dkd = double(c.X(0)[1]);
    g.dh = c.out[1].template data<T>();
    g.dW = c.a.no_weight_grad ? nullptr : c.out[2].template data<T>();
    sums = kernels::fused_linear_divergence<T>(in, &g);
  }
  c.Y[0] = T(sums[0]);
  c.Y[1] = T(sums[1]);
};

inline constexpr auto kLinearDivergenceScratch = [](const Graph& g, const Node& n) -> int64_t {
  const size_t h = linear_divergence_first(n.op);
  const int64_t N = g.shape(n.inputs[h])[0];
  const int64_t C = std::max<int64_t>(1, std::min(n.attrs.chunk_rows, N));
  kernels::DivergenceScratchShape s;
  s.chunk_rows = C;
  s.D = g.shape(n.inputs[h])[1];
  s.teacher_D = g.shape(n.inputs[h + 2])[1];
  s.V = g.shape(n.inputs[h + 1])[0];
  s.elem_bytes = int64_t(dtype_size(g.compute_dtype()));
  s.grads = h == 1;
  s.student_bf16 = g.type(n.inputs[h + 1]).dtype == DType::BF16;
  s.teacher_bf16 = g.type(n.inputs[h + 3]).dtype == DType::BF16;
  return kernels::fused_divergence_scratch_bytes(s);
};

// Both heads are read as stored: a bf16 head is widened a tile of rows at a time.
inline constexpr auto kLinearDivergenceReadsBf16 = [](const Node& n, size_t input) {
  const size_t h = linear_divergence_first(n.op);
  return input == h + 1 || input == h + 3;
};

inline constexpr OpDesc kFusedLinearDivergence = {
    .op = Op::FusedLinearDivergence,
    .name = "fused_linear_divergence",
    .min_inputs = 5,
    .max_inputs = 5,
    .shape = kLinearDivergenceShape,
    // The teacher (its hidden states and head) is a constant: only the student's hidden
    // states and head get gradients, from one backward sweep that recomputes both chunks of
    // logits (compile/fuse_linear_divergence.h merges it with this forward under
    // `compile: true`).
    .vjp =
        [](VjpContext& c) {
          Attrs a = c.a;
          a.no_weight_grad = !c.need[1];
          const std::vector<Value> f =
              c.g.add(Op::FusedLinearDivergenceBackward,
                      {c.dy, c.in[0], c.in[1], c.in[2], c.in[3], c.in[4]}, a);
          c.dx[0] = f[1];
          if (c.need[1]) c.dx[1] = f[2];
        },
    .gradcheck =
        [](GradcheckCase& t) {
          // Generalized JSD at beta 0.3, temperature 2, over chunks of 2 of 5 tokens (one
          // ignored): every term of the rule, and a last chunk that is not full.
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
          return t.g.add1(Op::FusedLinearDivergence,
                          {t.param("h", {5, 3}, -2, 2), t.param("W", {7, 3}, -1, 1),
                           t.g.input("teacher_h", {5, 2}, DType::F64),
                           t.g.input("teacher_W", {7, 2}, DType::F64), labels},
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
    .max_inputs = 6,
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
