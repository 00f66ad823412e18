#include "fusetune/compile/eliminate_copies.h"

#include <algorithm>

#include "fusetune/compile/rewrite.h"

namespace fusetune::passes::eliminate_copies {
namespace {

// The two swapped dims of a Transpose node, normalized and ordered.
std::pair<int, int> swapped(const Graph& g, const Node& t) {
  const int r = int(g.shape(t.inputs[0]).size());
  int d0 = t.attrs.dim0 < 0 ? t.attrs.dim0 + r : t.attrs.dim0;
  int d1 = t.attrs.dim1 < 0 ? t.attrs.dim1 + r : t.attrs.dim1;
  if (d0 > d1) std::swap(d0, d1);
  return {d0, d1};
}

}  // namespace

std::string run(Graph& g, const PassOptions& opts) {
  int flags = 0, pairs = 0;  // transposes read through MatMul flags; identity/cancelling
  auto allowed = [&](const Node& n) { return n.region <= opts.max_region(); };
  // Identity and cancelling transposes first (they may expose a transposed MatMul operand).
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& t = g.nodes()[i];
    if (t.op != Op::Transpose || !allowed(t)) continue;
    const auto [d0, d1] = swapped(g, t);
    Value to{};
    if (d0 == d1) {
      to = t.inputs[0];
    } else {
      const Node& inner = g.node(t.inputs[0]);
      if (inner.op == Op::Transpose && swapped(g, inner) == std::make_pair(d0, d1))
        to = inner.inputs[0];
    }
    if (!to.valid()) continue;
    replace_all_uses(g, {int(i), 0}, to);
    ++pairs;
  }
  for (Node& n : g.mutable_nodes()) {
    if (n.op != Op::MatMul || !allowed(n)) continue;
    for (int j = 0; j < 2; ++j) {
      const Node& t = g.node(n.inputs[size_t(j)]);
      if (t.op != Op::Transpose) continue;
      const int r = int(g.shape(t.inputs[0]).size());
      if (swapped(g, t) != std::make_pair(r - 2, r - 1)) continue;
      n.inputs[size_t(j)] = t.inputs[0];
      bool& flag = j == 0 ? n.attrs.trans_a : n.attrs.trans_b;
      flag = !flag;
      ++flags;
    }
  }
  // Transpose(MatMul(a, b), -2, -1) = MatMul(b, a) with the flags swapped and flipped:
  // (op(A) op(B))^T = op(B)^T op(A)^T. Autodiff emits these for transposed MatMul operands.
  std::unordered_map<int, double> keys;
  const std::vector<int> uses = use_counts(g);
  const int original = int(g.nodes().size());
  for (int i = 0; i < original; ++i) {
    const Node t = g.nodes()[size_t(i)];
    if (t.op != Op::Transpose || !allowed(t) || uses[size_t(i)] == 0) continue;
    const int r = int(g.shape(t.inputs[0]).size());
    if (swapped(g, t) != std::make_pair(r - 2, r - 1)) continue;
    const int m = t.inputs[0].node;
    const Node mm = g.nodes()[size_t(m)];
    if (mm.op != Op::MatMul || uses[size_t(m)] != 1 || mm.region != t.region) continue;
    Attrs at = mm.attrs;
    at.trans_a = !mm.attrs.trans_b;
    at.trans_b = !mm.attrs.trans_a;
    g.set_region(mm.region);
    g.set_layer(mm.layer);
    g.set_backward(mm.backward);
    const Value swapped_mm = g.add1(Op::MatMul, {mm.inputs[1], mm.inputs[0]}, at, mm.name);
    g.set_region(0);
    g.set_layer(-1);
    g.set_backward(false);
    replace_all_uses(g, {i, 0}, swapped_mm);
    keys[swapped_mm.node] = double(i);
    ++flags;
  }
  if (!flags && !pairs) return "eliminate_copies: no match";
  const size_t before = g.nodes().size();
  compact(g, keys);
  return "eliminate_copies: " + std::to_string(flags) + " transposes read by MatMul flags, " +
         std::to_string(pairs) + " identity/cancelling transposes, " +
         std::to_string(before - g.nodes().size()) + " nodes removed";
}

}  // namespace fusetune::passes::eliminate_copies
