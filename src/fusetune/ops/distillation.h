#pragma once
// Knowledge distillation's divergence between the student's and the teacher's logits
// (kernels/cpu/divergence.h, losses/distillation.h). One entry per op (graph/op_desc.h,
// docs/design.md §1). attrs.groups = the kernels::DivergenceKind, attrs.scalar = beta
// (generalized JSD), attrs.eps = the temperature.
#include "fusetune/graph/op_desc.h"
#include "fusetune/kernels/cpu/divergence.h"

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

inline constexpr const OpDesc* kDistillationOps[] = {&kDivergence, &kDivergenceBackward};

}  // namespace fusetune::ops
