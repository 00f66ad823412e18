#pragma once
// One description per op (docs/design.md §1, "The op table"): its name, arity, shape and dtype
// rule, VJP (or why it has none), fp32/fp64 kernel, bf16 policy, in-place inputs and kernel
// scratch, and a small float64 instance on which the test checks its VJP by finite differences.
// The descriptions live in src/fusetune/ops/, one file per op family; graph/ and runtime/ reach
// them through op_desc(), declared here and defined in ops/op_table.cpp. ops/ is a layer above
// graph, kernels and runtime (it builds VJP subgraphs and calls kernels), so its includes point
// down; only the linker resolves this one declaration upwards.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fusetune/core/tensor.h"
#include "fusetune/graph/graph.h"

namespace fusetune {

using Types = std::vector<TensorType>;

// What a shape rule reads (the inputs' types, the attrs, the graph's float dtype), with the
// checks the rules share; a failed check throws "shape error in <op>: <why>".
struct ShapeCheck {
  const Graph& g;
  Op op;
  const std::vector<Value>& in;
  const Attrs& a;
  DType fd;  // the graph's float dtype: every floating output's type

  const TensorType& T(size_t i) const { return g.type(in[i]); }
  const Shape& S(size_t i) const { return g.type(in[i]).shape; }
  [[noreturn]] void fail(const std::string& why) const;
  void need_float(size_t i) const;  // F32 or F64 as the graph, or F32 in a BF16 graph
  void need_i32(size_t i) const;
  void same(size_t i, size_t j) const;     // equal shapes
  int norm_dim(int d, size_t rank) const;  // a negative dim counts from the end
};

// Whether `small` is a suffix of `big` (the broadcast the elementwise ops allow).
bool is_suffix(const Shape& small, const Shape& big);

// What a VJP rule reads (the forward node, its output y and the output's gradient dy) and
// where it writes: dx[i] = the gradient of input i, left invalid where need[i] is false or the
// input gets none. Nodes it adds are emitted into the backward of `g`.
struct VjpContext {
  Graph& g;
  const Node& n;
  const std::vector<Value>& in;
  const Attrs& a;
  Value y, dy;
  const std::vector<bool>& need;
  std::vector<Value>& dx;

  Value op(Op o, std::vector<Value> inputs, Attrs at = {}) {
    return g.add1(o, std::move(inputs), std::move(at));
  }
  // Reduces the gradient of a broadcast result back to the broadcast operand's shape.
  Value unbroadcast(Value grad, const Shape& to);
  Value reshape(Value v, Shape s);
};

// What a kernel reads and writes: the node, its input tensors and its preallocated outputs,
// all in the compute type T (float or double) except the I32 inputs and what
// OpDesc::reads_bf16 names.
template <class T>
struct KernelArgs {
  const Node& n;
  const std::vector<Tensor>& in;
  std::vector<Tensor>& out;
  const Attrs& a;
  T* Y;  // output 0

  T* X(size_t i) const { return in[i].template data<T>(); }
  const int32_t* I(size_t i) const { return in[i].template data<int32_t>(); }
};

template <class T>
using KernelFn = void (*)(const KernelArgs<T>&);

// The float and double instantiations of one kernel, written once as a template lambda
// `[]<class T>(const KernelArgs<T>& c) {...}`, or why the op runs none (leaves are bound,
// views alias their input).
struct Kernel {
  KernelFn<float> f32 = nullptr;
  KernelFn<double> f64 = nullptr;
  const char* why_none = nullptr;
  constexpr Kernel() = default;
  template <class F>
  constexpr Kernel(F f) : f32(f), f64(f) {}  // NOLINT(google-explicit-constructor)
  static constexpr Kernel none(const char* why) {
    Kernel k;
    k.why_none = why;
    return k;
  }
};

// Which input a kernel may write its output 0 over (runtime/node_kernels.h
// can_write_over_input): audited per kernel in kernels/cpu, every output element written only
// after each input element it depends on has been read.
enum class InPlace : uint8_t { Never, AnyInput, FirstInput, SecondInput };

// A small instance of a differentiable op for the float64 finite-difference check of its VJP
// (tests/unit/graph_vjp_test.cpp builds every one): trainable params get random values in
// [lo, hi]; ids and constants hold what the example sets.
struct GradcheckCase {
  struct Param {
    std::string name;
    Shape shape;
    double lo, hi;
  };
  explicit GradcheckCase(Graph& graph) : g(graph) {}

  Graph& g;
  std::vector<Param> params;
  std::vector<std::pair<std::string, Tensor>> inputs;
  double tol = 1e-6;

  Value param(const std::string& name, Shape s, double lo = -1, double hi = 1);
  Value ids(const std::string& name, Shape s, const std::vector<int32_t>& values);
};

constexpr int kAnyArity = 1 << 20;

// The usual reasons an op has no VJP.
inline constexpr const char* kBackwardOp =
    "a backward op: emitted by a VJP rule, never differentiated again (no second-order "
    "gradients)";
inline constexpr const char* kFusedAfterAutodiff =
    "created by a compile pass from forward and backward ops after autodiff (docs/design.md §3)";

struct OpDesc {
  Op op;
  const char* name;
  int min_inputs = 0, max_inputs = 0;
  // Output types; runs after the arity check. Leaves have none (Graph::input/param/...).
  Types (*shape)(const ShapeCheck&) = nullptr;
  // Forward ops a model or loss may differentiate: the VJP rule; every other op states why it
  // has none.
  void (*vjp)(VjpContext&) = nullptr;
  const char* no_vjp = nullptr;
  // The float64 finite-difference check of the VJP, or why there is none.
  Value (*gradcheck)(GradcheckCase&) = nullptr;
  const char* no_gradcheck = nullptr;
  Kernel kernel;
  InPlace in_place = InPlace::Never;
  // bf16 (docs/design.md §6): outputs a BF16 graph keeps in fp32 beyond scalars (statistics
  // whose rounding costs accuracy); pointwise ops the BF16 path runs in widened chunks; inputs
  // the fp32 kernel reads as bf16 itself (a weight read tile by tile).
  bool (*keeps_f32)(size_t output) = nullptr;
  bool bf16_pointwise = false;
  bool (*reads_bf16)(const Node& n, size_t input) = nullptr;
  // Bytes of counted scratch the kernel allocates while it runs (compile/memory_estimate.h).
  int64_t (*scratch_bytes)(const Graph& g, const Node& n) = nullptr;
};

// The description of `op` (ops/op_table.cpp). Every op has one; the table checks that once.
const OpDesc& op_desc(Op op);

}  // namespace fusetune
