#include "fusetune/graph/autodiff.h"

#include <map>

#include "fusetune/graph/op_desc.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

// The gradient contribution for each input (invalid Value = none / not needed), from the VJP
// rule in the op's description (graph/op_desc.h).
std::vector<Value> vjp(Graph& g, const Node& n, int node_id, Value dy,
                       const std::vector<bool>& need) {
  std::vector<Value> dx(n.inputs.size());
  const OpDesc& d = op_desc(n.op);
  if (!d.vjp) throw Error(std::string("autodiff: no VJP rule for op ") + op_name(n.op));
  VjpContext c{g, n, n.inputs, n.attrs, Value{node_id, 0}, dy, need, dx};
  d.vjp(c);
  return dx;
}

}  // namespace

std::vector<std::pair<std::string, Value>> append_backward(Graph& g, Value loss) {
  FT_CHECK(g.shape(loss).empty(),
           "append_backward: the loss must be a scalar, got " + shape_str(g.shape(loss)));
  const int n_forward = int(g.nodes().size());
  std::vector<bool> needs(n_forward, false);
  for (int i = 0; i < n_forward; ++i) {
    const Node& n = g.nodes()[i];
    if (n.op == Op::Param) {
      needs[i] = n.trainable;
      continue;
    }
    for (const Value& v : n.inputs)
      if (needs[v.node] && is_floating(g.type(v).dtype)) needs[i] = true;
  }

  std::map<int, Value> grad;  // forward node id -> gradient of its (single) output
  const int saved_region = g.nodes()[loss.node].region;
  g.set_region(saved_region);
  g.set_backward(true);
  grad[loss.node] = g.fill({}, 1.0);

  for (int i = loss.node; i >= 0; --i) {
    if (!needs[i] || !grad.count(i)) continue;
    const Node n = g.nodes()[i];  // copy: emitting nodes may reallocate the node vector
    if (n.op == Op::Param || n.op == Op::Input || n.op == Op::Constant) continue;
    FT_CHECK(n.outputs.size() == 1,
             std::string("autodiff: multi-output op ") + op_name(n.op) + " in the forward graph");
    g.set_region(n.region);
    g.set_layer(n.layer);
    std::vector<bool> need(n.inputs.size());
    for (size_t j = 0; j < n.inputs.size(); ++j)
      need[j] = needs[n.inputs[j].node] && is_floating(g.type(n.inputs[j]).dtype);
    std::vector<Value> dx = vjp(g, n, i, grad[i], need);
    for (size_t j = 0; j < n.inputs.size(); ++j) {
      if (!need[j] || !dx[j].valid()) continue;
      int src = n.inputs[j].node;
      auto it = grad.find(src);
      if (it == grad.end())
        grad[src] = dx[j];
      else
        it->second = g.add1(Op::Add, {it->second, dx[j]});
    }
  }
  g.set_region(0);
  g.set_layer(-1);
  g.set_backward(false);

  std::vector<std::pair<std::string, Value>> out;
  for (int i = 0; i < n_forward; ++i) {
    const Node& n = g.nodes()[i];
    if (n.op != Op::Param || !n.trainable || !grad.count(i)) continue;
    out.push_back({n.name, grad[i]});
    g.mark_output("grad:" + n.name, grad[i]);
  }
  return out;
}

}  // namespace fusetune
