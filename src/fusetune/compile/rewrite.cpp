#include "fusetune/compile/rewrite.h"

#include <queue>

namespace fusetune {

void replace_all_uses(Graph& g, Value from, Value to) {
  for (Node& n : g.mutable_nodes())
    for (Value& v : n.inputs)
      if (v == from) v = to;
  for (auto& [name, v] : g.mutable_outputs())
    if (v == from) v = to;
}

std::vector<int> use_counts(const Graph& g) {
  std::vector<int> uses(g.nodes().size(), 0);
  for (const Node& n : g.nodes())
    for (const Value& v : n.inputs) ++uses[v.node];
  for (const auto& [name, v] : g.outputs()) ++uses[v.node];
  return uses;
}

void compact(Graph& g, const std::unordered_map<int, double>& order_keys) {
  auto& nodes = g.mutable_nodes();
  const int n = int(nodes.size());
  // Liveness: everything a graph output depends on. Inputs and params stay (they are bound
  // by name and a recipe may feed them regardless).
  std::vector<bool> live(n, false);
  std::vector<int> stack;
  for (const auto& [name, v] : g.outputs()) stack.push_back(v.node);
  for (int i = 0; i < n; ++i)
    if (nodes[i].op == Op::Input || nodes[i].op == Op::Param) stack.push_back(i);
  while (!stack.empty()) {
    int i = stack.back();
    stack.pop_back();
    if (live[i]) continue;
    live[i] = true;
    for (const Value& v : nodes[i].inputs) stack.push_back(v.node);
  }
  // Kahn's algorithm, smallest order key first.
  std::vector<int> pending(n, 0);
  std::vector<std::vector<int>> readers(n);
  for (int i = 0; i < n; ++i) {
    if (!live[i]) continue;
    for (const Value& v : nodes[i].inputs) {
      ++pending[i];
      readers[v.node].push_back(i);
    }
  }
  auto key = [&](int i) {
    auto it = order_keys.find(i);
    return it == order_keys.end() ? double(i) : it->second;
  };
  using Item = std::pair<double, int>;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> ready;
  for (int i = 0; i < n; ++i)
    if (live[i] && pending[i] == 0) ready.push({key(i), i});
  std::vector<int> order;
  while (!ready.empty()) {
    int i = ready.top().second;
    ready.pop();
    order.push_back(i);
    for (int r : readers[i])
      if (--pending[r] == 0) ready.push({key(r), r});
  }
  std::vector<int> new_id(n, -1);
  for (size_t k = 0; k < order.size(); ++k) new_id[order[k]] = int(k);
  std::vector<Node> out;
  out.reserve(order.size());
  for (int i : order) {
    Node node = std::move(nodes[i]);
    for (Value& v : node.inputs) v.node = new_id[v.node];
    out.push_back(std::move(node));
  }
  nodes = std::move(out);
  for (auto& [name, v] : g.mutable_outputs()) v.node = new_id[v.node];
}

std::vector<std::vector<int>> readers_of(const Graph& g) {
  std::vector<std::vector<int>> r(g.nodes().size());
  for (size_t i = 0; i < g.nodes().size(); ++i)
    for (const Value& v : g.nodes()[i].inputs) r[v.node].push_back(int(i));
  return r;
}

bool is_graph_output(const Graph& g, int node) {
  for (const auto& [name, v] : g.outputs())
    if (v.node == node) return true;
  return false;
}

}  // namespace fusetune
