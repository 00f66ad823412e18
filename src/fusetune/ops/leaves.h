#pragma once
// Leaves: the nodes a graph is fed or holds. They have no shape rule (Graph::input, param,
// constant and fill type them) and no VJP (gradients stop at them); only Fill runs a kernel.
// One entry per op (graph/op_desc.h, docs/design.md §1): to add an op, copy a neighbour's
// entry and list it in the family's ops at the end of this file.
#include <algorithm>

#include "fusetune/graph/op_desc.h"

namespace fusetune::ops {

inline constexpr OpDesc kInput = {
    .op = Op::Input,
    .name = "input",
    .max_inputs = kAnyArity,
    .no_vjp = "a leaf: fed per step",
    .kernel = Kernel::none("a leaf: bound to the step's input tensor"),
};

inline constexpr OpDesc kParam = {
    .op = Op::Param,
    .name = "param",
    .max_inputs = kAnyArity,
    .no_vjp = "a leaf: its gradient is the sum of its uses' (graph/autodiff.h)",
    .kernel = Kernel::none("a leaf: bound to the named parameter"),
};

inline constexpr OpDesc kConstant = {
    .op = Op::Constant,
    .name = "constant",
    .max_inputs = kAnyArity,
    .no_vjp = "a leaf: owned by the graph, never trained",
    .kernel = Kernel::none("a leaf: the graph's own tensor"),
};

inline constexpr OpDesc kFill = {
    .op = Op::Fill,
    .name = "fill",
    .max_inputs = kAnyArity,
    .no_vjp = "a leaf: a constant value",
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          std::fill(c.Y, c.Y + c.out[0].numel(), T(c.a.scalar));
        },
};

inline constexpr const OpDesc* kLeavesOps[] = {&kInput, &kParam, &kConstant, &kFill};

}  // namespace fusetune::ops
