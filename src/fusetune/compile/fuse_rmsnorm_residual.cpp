#include "fusetune/compile/fuse_rmsnorm_residual.h"

#include <unordered_map>
#include <unordered_set>

#include "fusetune/compile/rewrite.h"

namespace fusetune::passes::fuse_rmsnorm_residual {
namespace {

bool is_graph_output(const Graph& g, Value v) {
  for (const auto& [name, o] : g.outputs())
    if (o == v) return true;
  return false;
}

// A same-shape Add of two float tensors (no broadcast), rewritable in this mode.
bool plain_add(const Graph& g, const Node& n, int max_region) {
  return n.op == Op::Add && n.region <= max_region &&
         g.shape(n.inputs[0]) == g.shape(n.inputs[1]) &&
         g.type(n.inputs[0]).dtype == g.float_dtype() &&
         g.type(n.inputs[1]).dtype == g.float_dtype();
}

std::vector<Value> add_like(Graph& g, const Node& like, Op op, std::vector<Value> in, double eps,
                            const std::string& name) {
  Attrs at;
  at.eps = eps;
  auto out = g.add(op, std::move(in), at, name);
  Node& n = g.mutable_nodes()[out[0].node];
  n.region = like.region;
  n.layer = like.layer;
  n.backward = like.backward;
  return out;
}

}  // namespace

std::string run(Graph& g, const PassOptions& opts) {
  compact(g);  // dead readers would block a match
  const int n0 = int(g.nodes().size());
  const int max_region = opts.max_region();
  // Readers of output 0 of each node (a node reading it twice is listed twice).
  std::vector<std::vector<int>> readers0(static_cast<size_t>(n0));
  for (int i = 0; i < n0; ++i)
    for (const Value& v : g.nodes()[i].inputs)
      if (v.index == 0) readers0[v.node].push_back(i);
  std::unordered_map<int, double> keys;
  std::unordered_set<int> used_adds;
  int forward = 0, backward = 0;
  for (int i = 0; i < n0; ++i) {
    const Node n = g.nodes()[i];  // copy: adding nodes reallocates
    if (n.region > max_region) continue;
    if (n.op == Op::RMSNorm && !n.backward) {
      // Forward: RMSNorm(Add(h, x), w).
      const Value s = n.inputs[0];
      if (s.node >= n0 || s.index != 0 || used_adds.count(s.node)) continue;
      const Node a = g.nodes()[s.node];
      if (a.backward || !plain_add(g, a, max_region)) continue;
      if (opts.activation_checkpointing && a.layer != n.layer) continue;
      auto f = add_like(g, a, Op::AddRMSNorm, {a.inputs[0], a.inputs[1], n.inputs[1]}, n.attrs.eps,
                        "add_rmsnorm");
      keys[f[0].node] = double(i);
      replace_all_uses(g, s, f[0]);
      replace_all_uses(g, {i, 0}, f[1]);
      used_adds.insert(s.node);
      ++forward;
    } else if (n.op == Op::RMSNormBackward) {
      // Backward: dx read once, by an Add with the residual gradient.
      const Value dx{i, 0};
      if (readers0[i].size() != 1 || is_graph_output(g, dx)) continue;
      const int ai = readers0[i][0];
      const Node a = g.nodes()[ai];
      if (!plain_add(g, a, max_region) || a.inputs[0] == a.inputs[1]) continue;
      const Value dres = a.inputs[0] == dx ? a.inputs[1] : a.inputs[0];
      auto f = add_like(g, n, Op::RMSNormBackwardAdd, {n.inputs[0], n.inputs[1], n.inputs[2], dres},
                        n.attrs.eps, "rmsnorm_backward_add");
      keys[f[0].node] = double(ai);
      replace_all_uses(g, {ai, 0}, f[0]);
      replace_all_uses(g, {i, 1}, f[1]);
      ++backward;
    }
  }
  if (forward + backward == 0) return "fuse_rmsnorm_residual: no match";
  compact(g, keys);
  return "fuse_rmsnorm_residual: fused " + std::to_string(forward) + " add+rmsnorm, " +
         std::to_string(backward) + " rmsnorm_backward+add";
}

}  // namespace fusetune::passes::fuse_rmsnorm_residual
