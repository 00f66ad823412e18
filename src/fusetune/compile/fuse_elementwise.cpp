#include "fusetune/compile/fuse_elementwise.h"

#include <map>

#include "fusetune/compile/rewrite.h"
#include "fusetune/kernels/cpu/elementwise_program.h"

namespace fusetune::passes::fuse_elementwise {
namespace {

using kernels::EwInstr;
using kernels::EwOp;

bool fusable_op(Op op) {
  return op == Op::Add || op == Op::Mul || op == Op::Scale || op == Op::Silu ||
         op == Op::SiluBackward;
}

// Ops per fused node: with at most one more leaf than ops, 7 ops need at most 15 registers.
constexpr int kMaxOps = 7;

struct TreeBuilder {
  Graph& g;
  const std::vector<int>& uses;
  const Node& root;
  int64_t numel;
  int ops = 0;
  std::vector<int> absorbed;
  std::vector<Value> leaves;
  std::vector<EwInstr> code;

  bool same_group(const Node& n) const {
    return n.region == root.region && n.layer == root.layer && n.backward == root.backward;
  }

  // The fusable node computing `v` (through single-reader reshapes) that this tree may absorb,
  // or -1: it must be read by the tree alone and have the tree's element count.
  int absorbable(Value v) const {
    const Node* n = &g.node(v);
    int id = v.node;
    if (n->op == Op::Reshape && uses[id] == 1 && same_group(*n)) {
      id = n->inputs[0].node;
      n = &g.nodes()[id];
    }
    if (!fusable_op(n->op) || uses[id] != 1 || !same_group(*n)) return -1;
    if (n->outputs[0].numel() != numel) return -1;
    return id;
  }

  int emit(EwInstr I) {
    I.dst = int32_t(code.size());
    code.push_back(I);
    return I.dst;
  }

  // Emits the instructions computing `v`; returns its register.
  int value(Value v) {
    const Node& p = g.node(v);
    if (p.op == Op::Fill) {
      EwInstr c;
      c.op = EwOp::Const;
      c.c = p.attrs.scalar;
      return emit(c);
    }
    const int id = absorbable(v);
    if (id >= 0 && ops < kMaxOps) return node(id);
    for (size_t i = 0; i < leaves.size(); ++i)
      if (leaves[i] == v) {
        EwInstr l;
        l.op = EwOp::Load;
        l.a = int32_t(i);
        return emit(l);  // loaded again: registers are single-assignment, loads are cheap
      }
    leaves.push_back(v);
    EwInstr l;
    l.op = EwOp::Load;
    l.a = int32_t(leaves.size() - 1);
    return emit(l);
  }

  int node(int id) {
    ++ops;
    absorbed.push_back(id);
    const Node n = g.nodes()[id];
    EwInstr I;
    I.a = value(n.inputs[0]);
    if (n.inputs.size() > 1) I.b = value(n.inputs[1]);
    switch (n.op) {
      case Op::Add:
        I.op = EwOp::Add;
        break;
      case Op::Mul:
        I.op = EwOp::Mul;
        break;
      case Op::Scale:
        I.op = EwOp::Scale;
        I.c = n.attrs.scalar;
        break;
      case Op::Silu:
        I.op = EwOp::Silu;
        break;
      default:
        I.op = EwOp::SiluBackward;
        break;
    }
    return emit(I);
  }
};

}  // namespace

std::string run(Graph& g, const PassOptions& opts) {
  const std::vector<int> uses = use_counts(g);
  std::vector<bool> taken(g.nodes().size(), false);
  std::unordered_map<int, double> keys;
  int fused = 0, removed = 0;
  const int original = int(g.nodes().size());
  for (int i = original - 1; i >= 0; --i) {
    const Node root = g.nodes()[i];
    if (taken[i] || !fusable_op(root.op) || root.region > opts.max_region()) continue;
    if (root.outputs[0].dtype != g.float_dtype()) continue;
    TreeBuilder b{g, uses, root, root.outputs[0].numel(), 0, {}, {}, {}};
    b.node(i);
    if (b.ops < 2) continue;  // nothing to fuse with
    // A tree of constants alone (a backward's seed scaled twice: d(c2 (c1 x))/dx) reads no
    // tensor, which an Elementwise node cannot express; it is left as it is.
    if (b.leaves.empty()) continue;
    for (int id : b.absorbed) taken[id] = true;
    Attrs at;
    at.shape = root.outputs[0].shape;
    at.program = kernels::encode_program(b.code);
    g.set_region(root.region);
    g.set_layer(root.layer);
    g.set_backward(root.backward);
    const Value f = g.add1(Op::Elementwise, b.leaves, at, root.name);
    g.set_region(0);
    g.set_layer(-1);
    g.set_backward(false);
    replace_all_uses(g, {i, 0}, f);
    keys[f.node] = double(i);
    ++fused;
    removed += b.ops;
  }
  if (!fused) return "fuse_elementwise: no match";
  compact(g, keys);
  return "fuse_elementwise: " + std::to_string(removed) + " elementwise nodes fused into " +
         std::to_string(fused);
}

}  // namespace fusetune::passes::fuse_elementwise
