#include "fusetune/compile/activation_checkpointing.h"

#include <algorithm>
#include <map>
#include <set>

#include "fusetune/compile/rewrite.h"

namespace fusetune::passes::activation_checkpointing {

std::string run(Graph& g, const PassOptions& opts) {
  if (!opts.activation_checkpointing) return "activation_checkpointing: off";
  auto is_leaf = [](const Node& n) {
    return n.op == Op::Input || n.op == Op::Param || n.op == Op::Constant || n.op == Op::Fill;
  };
  std::map<int, std::vector<int>> forward;  // layer -> its forward (non-leaf) nodes, in order
  for (int i = 0; i < int(g.nodes().size()); ++i) {
    const Node& n = g.nodes()[i];
    if (!n.backward && n.layer >= 0 && !is_leaf(n)) forward[n.layer].push_back(i);
  }
  std::unordered_map<int, double> keys;
  int layers = 0, recomputed = 0;
  for (const auto& [layer, nodes] : forward) {
    // Values the forward reads outside the layer (its output) stay saved: they are the
    // checkpoints. Everything else of the layer that the backward reads is recomputed.
    std::set<int> inside(nodes.begin(), nodes.end());
    for (const Node& n : g.nodes())
      if (!n.backward && n.layer != layer)
        for (const Value& v : n.inputs) inside.erase(v.node);
    for (const auto& [name, v] : g.outputs()) inside.erase(v.node);
    int first_reader = -1;
    for (int i = 0; i < int(g.nodes().size()); ++i) {
      const Node& n = g.nodes()[i];
      if (!n.backward) continue;
      if (std::any_of(n.inputs.begin(), n.inputs.end(),
                      [&](const Value& v) { return inside.count(v.node) > 0; })) {
        first_reader = i;
        break;
      }
    }
    if (first_reader < 0) continue;
    // Re-emit the layer's forward; the copies read the layer's input (and params) as before.
    std::map<int, int> copy_of;
    g.set_layer(layer);
    g.set_backward(true);
    for (size_t k = 0; k < nodes.size(); ++k) {
      const Node src = g.nodes()[nodes[k]];
      std::vector<Value> in = src.inputs;
      for (Value& v : in)
        if (auto it = copy_of.find(v.node); it != copy_of.end()) v.node = it->second;
      g.set_region(src.region);
      const int id = g.add(src.op, in, src.attrs, src.name)[0].node;
      copy_of[nodes[k]] = id;
      keys[id] = double(first_reader) - 1.0 + double(k + 1) / double(nodes.size() + 1);
    }
    g.set_region(0);
    g.set_layer(-1);
    g.set_backward(false);
    // The backward reads the recomputed values instead of the saved ones.
    for (Node& n : g.mutable_nodes()) {
      if (!n.backward || copy_of.count(int(&n - g.nodes().data()))) continue;
      for (Value& v : n.inputs)
        if (inside.count(v.node)) v.node = copy_of.at(v.node);
    }
    ++layers;
    recomputed += int(nodes.size());
  }
  compact(g, keys);
  return "activation_checkpointing: " + std::to_string(layers) + " layers, " +
         std::to_string(recomputed) + " forward nodes recomputed in the backward";
}

}  // namespace fusetune::passes::activation_checkpointing
