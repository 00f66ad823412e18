// Every op's VJP against central finite differences in float64, and the op table
// (graph/op_desc.h, docs/design.md §1): every op has a complete description, and every VJP
// passes the finite-difference check on the instance its description gives.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>

#include "fusetune/graph/builder.h"
#include "fusetune/graph/op_desc.h"
#include "fusetune/graph/verifier.h"
#include "fusetune/util/error.h"
#include "gradcheck.h"

using namespace fusetune;
using fusetune::testing::check_gradients;
using fusetune::testing::random_tensor;

namespace {

// Builds loss = sum(f(params...) * R) for a fixed random R, so every output element matters.
struct OpCase {
  Graph g{DType::F64};
  Builder b{g};
  TensorMap params, inputs;
  uint64_t seed = 1;

  Value param(const std::string& name, Shape s, double lo = -1, double hi = 1) {
    params[name] = random_tensor(s, DType::F64, seed++, lo, hi);
    return g.param(name, s, true);
  }
  Value ids(const std::string& name, Shape s, std::vector<int32_t> v) {
    Tensor t = Tensor::empty(s, DType::I32);
    for (size_t i = 0; i < v.size(); ++i) t.data<int32_t>()[i] = v[i];
    inputs[name] = t;
    return g.input(name, s, DType::I32);
  }
  void check(Value y, double tol = 1e-6) {
    Value r = g.constant(random_tensor(g.shape(y), DType::F64, 999), "R");
    Value loss = b.sum(b.mul(y, r));
    g.mark_output("loss", loss);
    verify_graph(g);
    check_gradients(g, loss, params, inputs, 12, tol);
    verify_graph(g);
  }
};

}  // namespace

TEST(Vjp, MatMulAllTransposeFlags) {
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      OpCase c;
      Value a = c.param("a", ta ? Shape{4, 3} : Shape{3, 4});
      Value b = c.param("b", tb ? Shape{5, 4} : Shape{4, 5});
      c.check(c.b.matmul(a, b, ta, tb));
    }
}

TEST(Vjp, BatchedMatMul) {
  OpCase c;
  Value a = c.param("a", {2, 3, 4, 5});
  Value b = c.param("b", {2, 3, 6, 5});
  c.check(c.b.matmul(a, b, false, true));
}

TEST(Vjp, LinearWithBiasOn3dInput) {
  OpCase c;
  Value x = c.param("x", {2, 3, 4});
  Value w = c.param("w", {5, 4});
  Value bias = c.param("bias", {5});
  c.check(c.b.linear(x, w, bias));
}

TEST(Vjp, AddMulScaleWithBroadcast) {
  OpCase c;
  Value a = c.param("a", {3, 4});
  Value b = c.param("b", {4});
  Value s = c.param("s", {});
  c.check(c.b.scale(c.b.mul(c.b.add(a, b), c.b.mul(a, s)), 0.5));
}

TEST(Vjp, Silu) {
  OpCase c;
  c.check(c.b.silu(c.param("x", {5, 7}, -4, 4)));
}

TEST(Vjp, RMSNormInputAndWeight) {
  OpCase c;
  Value x = c.param("x", {3, 2, 8});
  Value w = c.param("w", {8});
  c.check(c.b.rmsnorm(x, w, 1e-5));
}

TEST(Vjp, RopeWithPositions) {
  OpCase c;
  Value x = c.param("x", {2, 3, 2, 6});
  Tensor cos = random_tensor({5, 3}, DType::F64, 7), sin = random_tensor({5, 3}, DType::F64, 8);
  // A real rotation: cos^2 + sin^2 = 1.
  for (int64_t i = 0; i < cos.numel(); ++i) {
    double ang = cos.data<double>()[i] * 3;
    cos.data<double>()[i] = std::cos(ang);
    sin.data<double>()[i] = std::sin(ang);
  }
  Value vc = c.g.constant(cos, "cos"), vs = c.g.constant(sin, "sin");
  Value pos = c.ids("pos", {2, 3}, {0, 1, 2, 4, 0, 3});
  c.check(c.b.rope(x, vc, vs, pos));
}

TEST(Vjp, SoftmaxAndLogSoftmax) {
  OpCase c;
  Value x = c.param("x", {4, 6}, -3, 3);
  c.check(c.b.add(c.b.softmax(x), c.b.log_softmax(x)));
}

TEST(Vjp, NllWithIgnoredRows) {
  OpCase c;
  Value x = c.param("x", {4, 5}, -3, 3);
  Value labels = c.ids("labels", {4}, {2, -100, 0, 4});
  Value loss = c.b.nll_sum(c.b.log_softmax(x), labels);
  c.g.mark_output("loss", loss);
  check_gradients(c.g, loss, c.params, c.inputs);
}

TEST(Vjp, EmbeddingWithRepeatedIds) {
  OpCase c;
  Value table = c.param("table", {6, 3});
  Value ids = c.ids("ids", {2, 3}, {1, 4, 1, 0, 5, 1});
  c.check(c.b.embedding(table, ids));
}

TEST(Vjp, CausalMaskAndDocumentMask) {
  OpCase c;
  Value s = c.param("s", {2, 2, 4, 4}, -2, 2);
  Value docs = c.ids("docs", {2, 4}, {0, 0, 1, 1, 0, 0, 0, 0});
  c.check(c.b.softmax(c.b.causal_mask(s, docs)));
}

TEST(Vjp, RepeatHeadsTransposeReshapeSlice) {
  OpCase c;
  Value x = c.param("x", {2, 2, 3, 4});
  Value y = c.b.transpose(c.b.repeat_heads(x, 3), 1, 2);  // [2, 3, 6, 4]
  y = c.b.slice(c.b.reshape(y, {2, 3, 24}), 2, 5, 10);
  c.check(y);
}

TEST(Vjp, SumToShapeAndExpand) {
  OpCase c;
  Value x = c.param("x", {3, 4});
  Attrs at;
  at.shape = {4};
  Value r = c.g.add1(Op::SumToShape, {x}, at);
  Attrs ex;
  ex.shape = {2, 2};
  Value e = c.g.add1(Op::Expand, {c.b.sum(c.b.mul(r, r))}, ex);
  c.check(c.b.add(c.b.reshape(e, {4}), r));
}

TEST(Vjp, FrozenParamsGetNoGradient) {
  Graph g(DType::F64);
  Builder b(g);
  Value w = g.param("frozen", {3, 3}, false);
  Value x = g.param("x", {2, 3}, true);
  Value loss = b.sum(b.matmul(x, w));
  g.mark_output("loss", loss);
  auto grads = append_backward(g, loss);
  ASSERT_EQ(grads.size(), 1u);
  EXPECT_EQ(grads[0].first, "x");
  for (const Node& n : g.nodes())
    if (n.op == Op::MatMul && n.inputs.size() == 2) {
      // No matmul may produce a [3, 3] gradient for the frozen weight.
      EXPECT_NE(n.outputs[0].shape, (Shape{3, 3}));
    }
}

TEST(Graph, ShapeErrorsNameTheOp) {
  Graph g;
  Builder b(g);
  Value a = g.param("a", {3, 4}, true);
  Value c = g.param("c", {5, 6}, true);
  try {
    b.matmul(a, c);
    FAIL() << "expected a shape error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("matmul"), std::string::npos) << e.what();
  }
}

namespace {

// Every op of the op table (graph/op_desc.h, docs/design.md §1).
std::vector<Op> all_ops() {
  std::vector<Op> ops;
  for (int i = 0; i < int(Op::kCount); ++i) ops.push_back(Op(i));
  return ops;
}

bool is_leaf(Op op) {
  return op == Op::Input || op == Op::Param || op == Op::Constant || op == Op::Fill;
}

}  // namespace

TEST(OpTable, EveryOpHasANameAShapeRuleAndAKernel) {
  std::set<std::string> names;
  for (Op op : all_ops()) {
    const OpDesc& d = op_desc(op);
    ASSERT_EQ(d.op, op) << "op " << int(op) << " is described by another op's entry";
    ASSERT_NE(d.name, nullptr) << "op " << int(op);
    SCOPED_TRACE(d.name);
    EXPECT_TRUE(names.insert(d.name).second) << "two ops are named " << d.name;
    EXPECT_STREQ(op_name(op), d.name);
    EXPECT_LE(d.min_inputs, d.max_inputs);
    EXPECT_EQ(d.shape == nullptr, is_leaf(op)) << "every op but a leaf has a shape rule";
    const bool kernel = d.kernel.f32 != nullptr && d.kernel.f64 != nullptr;
    EXPECT_NE(kernel, d.kernel.why_none != nullptr) << "a kernel, or why the op runs none";
  }
}

TEST(OpTable, EveryOpHasAVjpOrSaysWhyNot) {
  for (Op op : all_ops()) {
    const OpDesc& d = op_desc(op);
    SCOPED_TRACE(d.name);
    EXPECT_NE(d.vjp != nullptr, d.no_vjp != nullptr) << "a VJP rule, or why the op has none";
    if (d.vjp)
      EXPECT_NE(d.gradcheck != nullptr, d.no_gradcheck != nullptr)
          << "a differentiable op needs a finite-difference check (OpDesc::gradcheck) or why not";
    else
      EXPECT_EQ(d.gradcheck, nullptr) << "a finite-difference check of a VJP the op lacks";
  }
}

// loss = sum(y * R) for a fixed random R, so every element of the op's output matters.
TEST(OpTable, EveryVjpMatchesFiniteDifferencesInFloat64) {
  int checked = 0;
  for (Op op : all_ops()) {
    const OpDesc& d = op_desc(op);
    if (!d.gradcheck) continue;
    SCOPED_TRACE(d.name);
    Graph g(DType::F64);
    GradcheckCase t(g);
    const Value y = d.gradcheck(t);
    bool uses_op = false;
    for (const Node& n : g.nodes()) uses_op |= n.op == op;
    EXPECT_TRUE(uses_op) << "the finite-difference instance does not use the op";
    ASSERT_FALSE(t.params.empty()) << "nothing to differentiate";
    TensorMap params, inputs;
    uint64_t seed = 1;
    for (const GradcheckCase::Param& p : t.params)
      params[p.name] = random_tensor(p.shape, DType::F64, seed++, p.lo, p.hi);
    for (const auto& [name, tensor] : t.inputs) inputs[name] = tensor;
    const Value r = g.constant(random_tensor(g.shape(y), DType::F64, 999), "R");
    const Value loss = g.add1(Op::SumAll, {g.add1(Op::Mul, {y, r})});
    g.mark_output("loss", loss);
    verify_graph(g);
    check_gradients(g, loss, params, inputs, 12, t.tol);
    verify_graph(g);
    ++checked;
  }
  EXPECT_GE(checked, 27);  // the forward ops a model, loss or adapter differentiates
}

TEST(OpTable, ShapeErrorsNameTheOpAndCheckTheArity) {
  Graph g;
  const Value a = g.param("a", {3, 4}, true);
  try {
    g.add1(Op::Silu, {a, a});
    FAIL() << "expected a shape error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("silu: wrong number of inputs (2)"), std::string::npos)
        << e.what();
  }
}
