#pragma once
// Elementwise ops: arithmetic, activations, dropout, and the fused pointwise ops compile passes
// create. One entry per op (graph/op_desc.h, docs/design.md §1): to add an op, copy a neighbour's
// entry and list it in the family's ops at the end of this file.
#include <algorithm>
#include <vector>

#include "fusetune/graph/op_desc.h"
#include "fusetune/kernels/cpu/elementwise_program.h"
#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/kernels/cpu/peft_ops.h"
#include "fusetune/kernels/cpu/preference_ops.h"
#include "fusetune/kernels/cpu/swiglu.h"
#include "fusetune/ops/shape_rules.h"

namespace fusetune::ops {

namespace k = kernels;

// The shape rule of Add, Mul.
inline constexpr auto kAddShape = [](const ShapeCheck& c) -> Types {
  c.need_float(0);
  c.need_float(1);
  if (!is_suffix(c.S(1), c.S(0)))
    c.fail(shape_str(c.S(1)) + " does not broadcast to " + shape_str(c.S(0)));
  return {{c.S(0), c.fd}};
};

inline constexpr OpDesc kAdd = {
    .op = Op::Add,
    .name = "add",
    .min_inputs = 2,
    .max_inputs = 2,
    .shape = kAddShape,
    .vjp =
        [](VjpContext& c) {
          if (c.need[0]) c.dx[0] = c.dy;
          if (c.need[1]) c.dx[1] = c.unbroadcast(c.dy, c.g.shape(c.in[1]));
        },
    .gradcheck =
        [](GradcheckCase& t) {
          return t.g.add1(Op::Add, {t.param("a", {3, 4}), t.param("b", {4})});  // b broadcast
        },
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          k::add<T>(c.X(0), c.X(1), c.Y, c.in[0].numel(), c.in[1].numel());
        },
    // Same-index loops (kernels/cpu/elementwise.cpp); the planner's equal-size check excludes a
    // broadcast second operand.
    .in_place = InPlace::AnyInput,
    .bf16_pointwise = true,
};

inline constexpr OpDesc kMul = {
    .op = Op::Mul,
    .name = "mul",
    .min_inputs = 2,
    .max_inputs = 2,
    .shape = kAddShape,
    .vjp =
        [](VjpContext& c) {
          if (c.need[0]) c.dx[0] = c.op(Op::Mul, {c.dy, c.in[1]});
          if (c.need[1])
            c.dx[1] = c.unbroadcast(c.op(Op::Mul, {c.dy, c.in[0]}), c.g.shape(c.in[1]));
        },
    .gradcheck =
        [](GradcheckCase& t) {
          return t.g.add1(Op::Mul, {t.param("a", {3, 4}), t.param("b", {4})});  // b broadcast
        },
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          k::mul<T>(c.X(0), c.X(1), c.Y, c.in[0].numel(), c.in[1].numel());
        },
    // Same-index loops (kernels/cpu/elementwise.cpp); the planner's equal-size check excludes a
    // broadcast second operand.
    .in_place = InPlace::AnyInput,
    .bf16_pointwise = true,
};

inline constexpr OpDesc kScale = {
    .op = Op::Scale,
    .name = "scale",
    .min_inputs = 1,
    .max_inputs = 1,
    .shape = kFloatSameShape,
    .vjp =
        [](VjpContext& c) {
          Attrs at;
          at.scalar = c.a.scalar;
          c.dx[0] = c.op(Op::Scale, {c.dy}, at);
        },
    .gradcheck =
        [](GradcheckCase& t) {
          Attrs at;
          at.scalar = 0.5;
          return t.g.add1(Op::Scale, {t.param("x", {3, 4})}, at);
        },
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          k::scale<T>(c.X(0), T(c.a.scalar), c.Y, c.in[0].numel());
        },
    .in_place = InPlace::FirstInput,  // a same-index loop
    .bf16_pointwise = true,
};

inline constexpr OpDesc kSilu = {
    .op = Op::Silu,
    .name = "silu",
    .min_inputs = 1,
    .max_inputs = 1,
    .shape = kFloatSameShape,
    .vjp =
        [](VjpContext& c) {
          c.dx[0] = c.op(Op::SiluBackward, {c.in[0], c.dy});
        },
    .gradcheck =
        [](GradcheckCase& t) {
          return t.g.add1(Op::Silu, {t.param("x", {5, 7}, -4, 4)});
        },
    .kernel = []<class T>(const KernelArgs<T>& c) { k::silu<T>(c.X(0), c.Y, c.in[0].numel()); },
    .in_place = InPlace::FirstInput,  // a same-index loop
    .bf16_pointwise = true,
};

inline constexpr OpDesc kSiluBackward = {
    .op = Op::SiluBackward,
    .name = "silu_backward",
    .min_inputs = 2,
    .max_inputs = 2,
    .shape = kGradSameShape,
    .no_vjp = kBackwardOp,
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          k::silu_backward<T>(c.X(0), c.X(1), c.Y, c.in[0].numel());
        },
    .in_place = InPlace::AnyInput,  // dx[i] from x[i], dy[i]
    .bf16_pointwise = true,
};

inline constexpr OpDesc kSwiGLU = {
    .op = Op::SwiGLU,
    .name = "swiglu",
    .min_inputs = 2,
    .max_inputs = 2,
    .shape = [](const ShapeCheck& c) -> Types {
      c.need_float(0);
      c.same(0, 1);
      return {{c.S(0), c.fd}};
    },
    .no_vjp = kFusedAfterAutodiff,
    .kernel =
        []<class T>(const KernelArgs<T>& c) { k::swiglu<T>(c.X(0), c.X(1), c.Y, c.in[0].numel()); },
    .bf16_pointwise = true,
};

inline constexpr OpDesc kSwiGLUBackward = {
    .op = Op::SwiGLUBackward,
    .name = "swiglu_backward",
    .min_inputs = 3,
    .max_inputs = 3,
    .shape = [](const ShapeCheck& c) -> Types {
      c.need_float(0);
      c.same(0, 1);
      c.same(0, 2);
      return {{c.S(0), c.fd}, {c.S(0), c.fd}};
    },
    .no_vjp = kBackwardOp,
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          k::swiglu_backward<T>(c.X(0), c.X(1), c.X(2), c.Y, c.out[1].template data<T>(),
                                c.in[0].numel());
        },
    .bf16_pointwise = true,
};

inline constexpr OpDesc kElementwise = {
    .op = Op::Elementwise,
    .name = "elementwise",
    .max_inputs = kAnyArity,
    .shape = [](const ShapeCheck& c) -> Types {
      if (c.in.empty()) c.fail("needs at least one input");
      if (c.a.program.empty()) c.fail("empty program");
      const int64_t n = shape_numel(c.a.shape);
      for (size_t i = 0; i < c.in.size(); ++i) {
        c.need_float(i);
        const int64_t ni = c.T(i).numel();
        if (ni < 1 || n % ni != 0)
          c.fail("input " + std::to_string(i) + " " + shape_str(c.S(i)) +
                 " does not repeat evenly over " + shape_str(c.a.shape));
      }
      return {{c.a.shape, c.fd}};
    },
    .no_vjp = kFusedAfterAutodiff,
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          std::vector<const T*> xs;
          std::vector<int64_t> ns;
          for (size_t i = 0; i < c.in.size(); ++i) {
            xs.push_back(c.X(i));
            ns.push_back(c.in[i].numel());
          }
          k::elementwise_program<T>(k::decode_program(c.a.program), xs, ns, c.Y, c.out[0].numel());
        },
    // elementwise_program.cpp writes each block's result after reading the block's inputs;
    // only a same-size input can have the output's size.
    .in_place = InPlace::AnyInput,
    .bf16_pointwise = true,
};

inline constexpr OpDesc kLogSigmoid = {
    .op = Op::LogSigmoid,
    .name = "log_sigmoid",
    .min_inputs = 1,
    .max_inputs = 1,
    .shape = kFloatSameShape,
    .vjp =
        [](VjpContext& c) {
          c.dx[0] = c.op(Op::LogSigmoidBackward, {c.in[0], c.dy});
        },
    .gradcheck =
        [](GradcheckCase& t) {
          return t.g.add1(Op::LogSigmoid, {t.param("x", {3, 5}, -4, 4)});
        },
    .kernel =
        []<class T>(const KernelArgs<T>& c) { k::log_sigmoid<T>(c.X(0), c.Y, c.in[0].numel()); },
    .keeps_f32 = [](size_t) { return true; },  // per-sequence preference-loss terms
};

// The shape rule of LogSigmoidBackward, ReluBackward.
inline constexpr auto kLogSigmoidBackwardShape = [](const ShapeCheck& c) -> Types {
  c.need_float(0);
  c.need_float(1);
  c.same(0, 1);
  return {{c.S(0), c.fd}};
};

inline constexpr OpDesc kLogSigmoidBackward = {
    .op = Op::LogSigmoidBackward,
    .name = "log_sigmoid_backward",
    .min_inputs = 2,
    .max_inputs = 2,
    .shape = kLogSigmoidBackwardShape,
    .no_vjp = kBackwardOp,
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          k::log_sigmoid_backward<T>(c.X(0), c.X(1), c.Y, c.in[0].numel());
        },
    .keeps_f32 = [](size_t) { return true; },  // per-sequence preference-loss terms
};

inline constexpr OpDesc kRelu = {
    .op = Op::Relu,
    .name = "relu",
    .min_inputs = 1,
    .max_inputs = 1,
    .shape = kFloatSameShape,
    .vjp =
        [](VjpContext& c) {
          c.dx[0] = c.op(Op::ReluBackward, {c.in[0], c.dy});
        },
    .gradcheck =
        [](GradcheckCase& t) {
          return t.g.add1(Op::Relu, {t.param("x", {3, 5})});
        },
    .kernel = []<class T>(const KernelArgs<T>& c) { k::relu<T>(c.X(0), c.Y, c.in[0].numel()); },
};

inline constexpr OpDesc kReluBackward = {
    .op = Op::ReluBackward,
    .name = "relu_backward",
    .min_inputs = 2,
    .max_inputs = 2,
    .shape = kLogSigmoidBackwardShape,
    .no_vjp = kBackwardOp,
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          k::relu_backward<T>(c.X(0), c.X(1), c.Y, c.in[0].numel());
        },
};

inline constexpr OpDesc kExp = {
    .op = Op::Exp,
    .name = "exp",
    .min_inputs = 1,
    .max_inputs = 1,
    .shape = kFloatSameShape,
    .vjp =
        [](VjpContext& c) {
          c.dx[0] = c.op(Op::Mul, {c.dy, c.y});  // d e^x = e^x dx: the output, not recomputed
        },
    .gradcheck =
        [](GradcheckCase& t) {
          return t.g.add1(Op::Exp, {t.param("x", {3, 5}, -2, 2)});
        },
    .kernel = []<class T>(
                  const KernelArgs<T>& c) { k::exp_elementwise<T>(c.X(0), c.Y, c.in[0].numel()); },
    .keeps_f32 = [](size_t) { return true; },  // GRPO's per-token ratios (losses/grpo.h)
};

inline constexpr OpDesc kDropout = {
    .op = Op::Dropout,
    .name = "dropout",
    .min_inputs = 2,
    .max_inputs = 2,
    .shape = [](const ShapeCheck& c) -> Types {
      c.need_float(0);
      c.need_i32(1);
      if (!c.S(1).empty()) c.fail("the seed must be a scalar");
      if (c.a.scalar < 0 || c.a.scalar >= 1) c.fail("p must be in [0, 1)");
      return {{c.S(0), c.fd}};
    },
    .vjp =
        [](VjpContext& c) {
          c.dx[0] = c.op(Op::Dropout, {c.dy, c.in[1]}, c.a);
          // the same mask
        },
    .gradcheck =
        [](GradcheckCase& t) {
          Attrs at;  // a fixed mask: the seed and salt decide it
          at.scalar = 0.25;
          at.start = 3;
          return t.g.add1(Op::Dropout, {t.param("x", {4, 8}), t.ids("seed", {}, {7})}, at);
        },
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          k::dropout<T>(c.X(0), c.Y, c.in[0].numel(), c.a.scalar, uint64_t(uint32_t(c.I(1)[0])),
                        uint64_t(c.a.start));
        },
    .in_place = InPlace::FirstInput,  // a same-index loop (kernels/cpu/peft_ops.cpp)
};

inline constexpr OpDesc kGeluTanh = {
    .op = Op::GeluTanh,
    .name = "gelu_tanh",
    .min_inputs = 1,
    .max_inputs = 1,
    .shape = kFloatSameShape,
    .vjp =
        [](VjpContext& c) {
          c.dx[0] = c.op(Op::GeluTanhBackward, {c.in[0], c.dy});
        },
    .gradcheck =
        [](GradcheckCase& t) {
          return t.g.add1(Op::GeluTanh, {t.param("x", {5, 7}, -4, 4)});
        },
    .kernel =
        []<class T>(const KernelArgs<T>& c) { k::gelu_tanh<T>(c.X(0), c.Y, c.in[0].numel()); },
    .in_place = InPlace::FirstInput,  // a same-index loop
    .bf16_pointwise = true,
};

inline constexpr OpDesc kGeluTanhBackward = {
    .op = Op::GeluTanhBackward,
    .name = "gelu_tanh_backward",
    .min_inputs = 2,
    .max_inputs = 2,
    .shape = kGradSameShape,
    .no_vjp = kBackwardOp,
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          k::gelu_tanh_backward<T>(c.X(0), c.X(1), c.Y, c.in[0].numel());
        },
    .in_place = InPlace::AnyInput,  // dx[i] from x[i], dy[i]
    .bf16_pointwise = true,
};

// The shape rule of Softcap: a positive cap.
inline constexpr auto kSoftcapShape = [](const ShapeCheck& c) -> Types {
  if (!(c.a.scalar > 0)) c.fail("the cap must be positive");
  return kFloatSameShape(c);
};

inline constexpr OpDesc kSoftcap = {
    .op = Op::Softcap,
    .name = "softcap",
    .min_inputs = 1,
    .max_inputs = 1,
    .shape = kSoftcapShape,
    .vjp =
        [](VjpContext& c) {
          c.dx[0] = c.op(Op::SoftcapBackward, {c.y, c.dy}, c.a);
        },
    .gradcheck =
        [](GradcheckCase& t) {
          Attrs at;  // a cap that bites: |x| up to twice the cap
          at.scalar = 2.0;
          return t.g.add1(Op::Softcap, {t.param("x", {4, 6}, -4, 4)}, at);
        },
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          k::softcap<T>(c.X(0), T(c.a.scalar), c.Y, c.in[0].numel());
        },
    .in_place = InPlace::FirstInput,  // a same-index loop
    .bf16_pointwise = true,
};

inline constexpr OpDesc kSoftcapBackward = {
    .op = Op::SoftcapBackward,
    .name = "softcap_backward",
    .min_inputs = 2,
    .max_inputs = 2,
    .shape = kGradSameShape,
    .no_vjp = kBackwardOp,
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          k::softcap_backward<T>(c.X(0), c.X(1), T(c.a.scalar), c.Y, c.in[0].numel());
        },
    .in_place = InPlace::AnyInput,  // dx[i] from y[i], dy[i]
    .bf16_pointwise = true,
};

inline constexpr const OpDesc* kElementwiseOps[] = {&kAdd,
                                                    &kMul,
                                                    &kScale,
                                                    &kSilu,
                                                    &kSiluBackward,
                                                    &kSwiGLU,
                                                    &kSwiGLUBackward,
                                                    &kElementwise,
                                                    &kLogSigmoid,
                                                    &kLogSigmoidBackward,
                                                    &kRelu,
                                                    &kReluBackward,
                                                    &kExp,
                                                    &kDropout,
                                                    &kGeluTanh,
                                                    &kGeluTanhBackward,
                                                    &kSoftcap,
                                                    &kSoftcapBackward};

}  // namespace fusetune::ops
