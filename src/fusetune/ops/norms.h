#pragma once
// Reductions, broadcasts, norms and softmax: ops over whole rows or tensors.
// One entry per op (graph/op_desc.h, docs/design.md §1): to add an op, copy a neighbour's
// entry and list it in the family's ops at the end of this file.
#include "fusetune/graph/op_desc.h"
#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/kernels/cpu/peft_ops.h"
#include "fusetune/kernels/cpu/preference_ops.h"
#include "fusetune/kernels/cpu/rmsnorm_fused.h"
#include "fusetune/ops/shape_rules.h"

namespace fusetune::ops {

namespace k = kernels;

inline constexpr OpDesc kSumAll = {
    .op = Op::SumAll,
    .name = "sum_all",
    .min_inputs = 1,
    .max_inputs = 1,
    .shape = [](const ShapeCheck& c) -> Types {
      c.need_float(0);
      return {{Shape{}, c.fd}};
    },
    .vjp =
        [](VjpContext& c) {
          Attrs at;
          at.shape = c.g.shape(c.in[0]);
          c.dx[0] = c.op(Op::Expand, {c.dy}, at);
        },
    .gradcheck =
        [](GradcheckCase& t) {
          return t.g.add1(Op::SumAll, {t.param("x", {3, 4})});
        },
    .kernel =
        []<class T>(const KernelArgs<T>& c) { c.Y[0] = T(k::sum_all<T>(c.X(0), c.in[0].numel())); },
};

inline constexpr OpDesc kExpand = {
    .op = Op::Expand,
    .name = "expand",
    .min_inputs = 1,
    .max_inputs = 1,
    .shape = [](const ShapeCheck& c) -> Types {
      if (!c.S(0).empty()) c.fail("input must be a scalar");
      return {{c.a.shape, c.fd}};
    },
    .vjp = [](VjpContext& c) { c.dx[0] = c.op(Op::SumAll, {c.dy}); },
    .gradcheck =
        [](GradcheckCase& t) {
          Attrs at;
          at.shape = {2, 3};
          return t.g.add1(Op::Expand, {t.param("s", {})}, at);
        },
    .kernel =
        []<class T>(const KernelArgs<T>& c) { std::fill(c.Y, c.Y + c.out[0].numel(), c.X(0)[0]); },
};

inline constexpr OpDesc kSumToShape = {
    .op = Op::SumToShape,
    .name = "sum_to_shape",
    .min_inputs = 1,
    .max_inputs = 1,
    .shape = [](const ShapeCheck& c) -> Types {
      if (!is_suffix(c.a.shape, c.S(0)))
        c.fail(shape_str(c.a.shape) + " is not a suffix of " + shape_str(c.S(0)));
      return {{c.a.shape, c.fd}};
    },
    .vjp =
        [](VjpContext& c) {
          // Broadcasting back: y = sum over leading dims, so dx = dy repeated. Expressed as
          // Add(zeros, dy) with suffix broadcast.
          Value zeros = c.g.fill(c.g.shape(c.in[0]), 0.0);
          c.dx[0] = c.op(Op::Add, {zeros, c.dy});
        },
    .gradcheck =
        [](GradcheckCase& t) {
          Attrs at;
          at.shape = {4};
          return t.g.add1(Op::SumToShape, {t.param("x", {3, 4})}, at);
        },
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          k::sum_to_suffix<T>(c.X(0), c.Y, c.in[0].numel(), c.out[0].numel());
        },
};

inline constexpr OpDesc kRowSum = {
    .op = Op::RowSum,
    .name = "row_sum",
    .min_inputs = 1,
    .max_inputs = 1,
    .shape = [](const ShapeCheck& c) -> Types {
      c.need_float(0);
      if (c.S(0).empty()) c.fail("expects at least one dimension");
      Shape out(c.S(0).begin(), c.S(0).end() - 1);
      return {{out, c.fd}};
    },
    .vjp =
        [](VjpContext& c) {
          // dx[.., j] = dy[..]: dy as a column times a row of ones.
          const Shape& xs = c.g.shape(c.in[0]);
          const int64_t C = xs.back(), rows = c.g.type(c.in[0]).numel() / C;
          Attrs at;
          Value ones = c.g.fill({1, C}, 1.0);
          Value d = c.op(Op::MatMul, {c.reshape(c.dy, {rows, 1}), ones}, at);
          c.dx[0] = c.reshape(d, xs);
        },
    .gradcheck =
        [](GradcheckCase& t) {
          return t.g.add1(Op::RowSum, {t.param("x", {3, 5})});
        },
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          const int64_t C = c.in[0].shape().back();
          k::row_sum<T>(c.X(0), c.Y, c.in[0].numel() / C, C);
        },
    .keeps_f32 = [](size_t) { return true; },  // per-sequence sums (preference losses)
};

inline constexpr OpDesc kRMSNorm = {
    .op = Op::RMSNorm,
    .name = "rmsnorm",
    .min_inputs = 2,
    .max_inputs = 2,
    .shape = [](const ShapeCheck& c) -> Types {
      if (c.S(1).size() != 1 || c.S(0).empty() || c.S(0).back() != c.S(1)[0])
        c.fail("weight " + shape_str(c.S(1)) + " does not match " + shape_str(c.S(0)));
      return {{c.S(0), c.fd}};
    },
    .vjp =
        [](VjpContext& c) {
          Attrs at;
          at.eps = c.a.eps;
          auto outs = c.g.add(Op::RMSNormBackward, {c.in[0], c.in[1], c.dy}, at);
          c.dx[0] = outs[0];
          if (c.need[1]) c.dx[1] = outs[1];
        },
    .gradcheck =
        [](GradcheckCase& t) {
          Attrs at;
          at.eps = 1e-5;
          return t.g.add1(Op::RMSNorm, {t.param("x", {3, 2, 8}), t.param("w", {8})}, at);
        },
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          int64_t D = c.in[0].shape().back();
          k::rmsnorm_forward<T>(c.X(0), c.X(1), c.Y, c.in[0].numel() / D, D, c.a.eps);
        },
    // norm.cpp reads the row before writing it (the backward reads dy and x again for dw after
    // writing dx, so it is not listed).
    .in_place = InPlace::FirstInput,
};

inline constexpr OpDesc kRMSNormBackward = {
    .op = Op::RMSNormBackward,
    .name = "rmsnorm_backward",
    .min_inputs = 3,
    .max_inputs = 3,
    .shape = [](const ShapeCheck& c) -> Types {
      c.same(0, 2);
      return {{c.S(0), c.fd}, {c.S(1), c.fd}};
    },
    .no_vjp = kBackwardOp,
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          int64_t D = c.in[0].shape().back();
          k::rmsnorm_backward<T>(c.X(0), c.X(1), c.X(2), c.Y, c.out[1].template data<T>(),
                                 c.in[0].numel() / D, D, c.a.eps);
        },
};

inline constexpr OpDesc kAddRMSNorm = {
    .op = Op::AddRMSNorm,
    .name = "add_rmsnorm",
    .min_inputs = 3,
    .max_inputs = 3,
    .shape = [](const ShapeCheck& c) -> Types {
      c.need_float(0);
      c.same(0, 1);
      if (c.S(2).size() != 1 || c.S(0).empty() || c.S(0).back() != c.S(2)[0])
        c.fail("weight " + shape_str(c.S(2)) + " does not match " + shape_str(c.S(0)));
      return {{c.S(0), c.fd}, {c.S(0), c.fd}};
    },
    .no_vjp = kFusedAfterAutodiff,
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          const int64_t D = c.in[0].shape().back();
          k::add_rmsnorm_forward<T>(c.X(0), c.X(1), c.X(2), c.Y, c.out[1].template data<T>(),
                                    c.in[0].numel() / D, D, c.a.eps);
        },
};

inline constexpr OpDesc kRMSNormBackwardAdd = {
    .op = Op::RMSNormBackwardAdd,
    .name = "rmsnorm_backward_add",
    .min_inputs = 4,
    .max_inputs = 4,
    .shape = [](const ShapeCheck& c) -> Types {
      c.need_float(0);
      c.same(0, 2);
      c.same(0, 3);
      if (c.S(1).size() != 1 || c.S(0).empty() || c.S(0).back() != c.S(1)[0])
        c.fail("weight " + shape_str(c.S(1)) + " does not match " + shape_str(c.S(0)));
      return {{c.S(0), c.fd}, {c.S(1), c.fd}};
    },
    .no_vjp = kBackwardOp,
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          const int64_t D = c.in[0].shape().back();
          k::rmsnorm_backward_add<T>(c.X(0), c.X(1), c.X(2), c.X(3), c.Y,
                                     c.out[1].template data<T>(), c.in[0].numel() / D, D, c.a.eps);
        },
};

// RowInvNorm(W) = 1 / ||W[o, :]||; RowInvNorm(W, A, Bs) the same of W + Bs A (A [r, K],
// Bs [O, r]: DoRA's merged weight), a tile of rows at a time: that weight is never formed.
inline constexpr OpDesc kRowInvNorm = {
    .op = Op::RowInvNorm,
    .name = "row_inv_norm",
    .min_inputs = 1,
    .max_inputs = 3,
    .shape = [](const ShapeCheck& c) -> Types {
      c.need_float(0);
      if (c.S(0).size() != 2) c.fail("expects a matrix [O, K], got " + shape_str(c.S(0)));
      if (c.in.size() == 2) c.fail("expects W, or W, A and Bs (a low-rank term)");
      if (c.in.size() == 3) {
        c.need_float(1);
        c.need_float(2);
        const Shape &W = c.S(0), &A = c.S(1), &B = c.S(2);
        if (A.size() != 2 || A[1] != W[1] || B != Shape{W[0], A[0]})
          c.fail("expects A [r, K] and Bs [O, r] for W " + shape_str(W) + ", got " + shape_str(A) +
                 " and " + shape_str(B));
      }
      return {{Shape{c.S(0)[0]}, c.fd}};
    },
    // No gradient reaches x: detached, as PEFT's DoRA detaches the weight norm.
    .vjp = [](VjpContext&) {},
    .no_gradcheck = "detached by design: its VJP is zero, not the derivative",
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          if (c.in.size() == 3)
            k::row_inv_norm_low_rank<T>(c.X(0), c.X(1), c.X(2), c.Y, c.in[0].dim(0), c.in[0].dim(1),
                                        c.in[1].dim(0));
          else
            k::row_inv_norm<T>(c.X(0), c.Y, c.in[0].dim(0), c.in[0].dim(1));
        },
    .keeps_f32 = [](size_t) { return true; },  // DoRA's per-row 1 / ||W + BA||
};

inline constexpr OpDesc kSoftmax = {
    .op = Op::Softmax,
    .name = "softmax",
    .min_inputs = 1,
    .max_inputs = 1,
    .shape = kFloatSameShape,
    .vjp =
        [](VjpContext& c) {
          c.dx[0] = c.op(Op::SoftmaxBackward, {c.y, c.dy});
        },
    .gradcheck =
        [](GradcheckCase& t) {
          return t.g.add1(Op::Softmax, {t.param("x", {4, 6}, -3, 3)});
        },
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          int64_t C = c.in[0].shape().back();
          k::softmax_rows<T>(c.X(0), c.Y, c.in[0].numel() / C, C);
        },
    // A row is read (max, sums) before it is written, element j from element j (softmax.cpp).
    .in_place = InPlace::FirstInput,
};

inline constexpr OpDesc kSoftmaxBackward = {
    .op = Op::SoftmaxBackward,
    .name = "softmax_backward",
    .min_inputs = 2,
    .max_inputs = 2,
    .shape = kGradSameShape,
    .no_vjp = kBackwardOp,
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          int64_t C = c.in[0].shape().back();
          k::softmax_backward<T>(c.X(0), c.X(1), c.Y, c.in[0].numel() / C, C);
        },
    .in_place = InPlace::AnyInput,  // a row of y and dy is read before dx's row is written
};

inline constexpr OpDesc kLogSoftmax = {
    .op = Op::LogSoftmax,
    .name = "log_softmax",
    .min_inputs = 1,
    .max_inputs = 1,
    .shape = kFloatSameShape,
    .vjp =
        [](VjpContext& c) {
          c.dx[0] = c.op(Op::LogSoftmaxBackward, {c.y, c.dy});
        },
    .gradcheck =
        [](GradcheckCase& t) {
          return t.g.add1(Op::LogSoftmax, {t.param("x", {4, 6}, -3, 3)});
        },
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          int64_t C = c.in[0].shape().back();
          k::log_softmax_rows<T>(c.X(0), c.Y, c.in[0].numel() / C, C);
        },
    // A row is read (max, sums) before it is written, element j from element j (softmax.cpp).
    .in_place = InPlace::FirstInput,
};

inline constexpr OpDesc kLogSoftmaxBackward = {
    .op = Op::LogSoftmaxBackward,
    .name = "log_softmax_backward",
    .min_inputs = 2,
    .max_inputs = 2,
    .shape = kGradSameShape,
    .no_vjp = kBackwardOp,
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          int64_t C = c.in[0].shape().back();
          k::log_softmax_backward<T>(c.X(0), c.X(1), c.Y, c.in[0].numel() / C, C);
        },
    .in_place = InPlace::AnyInput,  // a row of y and dy is read before dx's row is written
};

inline constexpr const OpDesc* kNormsOps[] = {
    &kSumAll,          &kExpand,     &kSumToShape,         &kRowSum,     &kRMSNorm,
    &kRMSNormBackward, &kAddRMSNorm, &kRMSNormBackwardAdd, &kRowInvNorm, &kSoftmax,
    &kSoftmaxBackward, &kLogSoftmax, &kLogSoftmaxBackward};

}  // namespace fusetune::ops
