#include "fusetune/compile/params_at_use.h"

#include <algorithm>
#include <climits>

#include "fusetune/compile/rewrite.h"

namespace fusetune::passes::params_at_use {

std::string run(Graph& g, const PassOptions& opts) {
  const std::vector<std::vector<int>> readers = readers_of(g);
  std::unordered_map<int, double> keys;
  int moved = 0, split = 0;
  const size_t count = g.nodes().size();
  for (size_t i = 0; i < count; ++i) {
    if (g.nodes()[i].op != Op::Param || readers[i].empty()) continue;
    int first_forward = INT_MAX, first_backward = INT_MAX;
    for (int r : readers[i]) {
      int& first = g.nodes()[size_t(r)].backward ? first_backward : first_forward;
      first = std::min(first, r);
    }
    // Just before the first reader (ties: node order, as compact breaks them).
    keys[int(i)] = double(std::min(first_forward, first_backward)) - 0.5;
    ++moved;
    if (!opts.reshard_after_forward || first_forward == INT_MAX || first_backward == INT_MAX ||
        is_graph_output(g, int(i)))
      continue;
    Node copy = g.nodes()[i];
    copy.backward = true;
    g.mutable_nodes().push_back(std::move(copy));
    const int b = int(g.nodes().size()) - 1;
    for (int r : readers[i]) {
      Node& reader = g.mutable_nodes()[size_t(r)];
      if (!reader.backward) continue;
      for (Value& v : reader.inputs)
        if (v.node == int(i)) v.node = b;
    }
    keys[b] = double(first_backward) - 0.5;
    ++split;
  }
  compact(g, keys);
  return "params_at_use: " + std::to_string(moved) + " parameters bound at first use, " +
         std::to_string(split) + " bound again for the backward";
}

}  // namespace fusetune::passes::params_at_use
