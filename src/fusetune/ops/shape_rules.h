#pragma once
// Shape rules that ops of several families share.
#include "fusetune/graph/op_desc.h"

namespace fusetune::ops {

// A float input, an output of its shape: Scale, Silu, Relu, LogSigmoid, Log1mExp, Softmax,
// LogSoftmax.
inline constexpr auto kFloatSameShape = [](const ShapeCheck& c) -> Types {
  c.need_float(0);
  return {{c.S(0), c.fd}};
};

// Two inputs of one shape (y or x, and dy), a gradient of that shape: SiluBackward,
// SoftmaxBackward, LogSoftmaxBackward, Log1mExpBackward.
inline constexpr auto kGradSameShape = [](const ShapeCheck& c) -> Types {
  c.same(0, 1);
  return {{c.S(0), c.fd}};
};

}  // namespace fusetune::ops
