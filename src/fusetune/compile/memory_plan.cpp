#include "fusetune/compile/memory_plan.h"

#include <algorithm>
#include <climits>

#include "fusetune/runtime/node_kernels.h"

namespace fusetune {
namespace {

// The node whose buffer a value really lives in (following view chains).
int storage_root(const Graph& g, int node) {
  while (is_view_op(g.nodes()[node].op)) node = g.nodes()[node].inputs[0].node;
  return node;
}

}  // namespace

std::vector<int> last_uses(const Graph& g) {
  const auto& nodes = g.nodes();
  std::vector<int> last(nodes.size(), -1);
  for (size_t i = 0; i < nodes.size(); ++i)
    for (const Value& v : nodes[i].inputs) {
      last[v.node] = std::max(last[v.node], int(i));
      int root = storage_root(g, v.node);
      last[root] = std::max(last[root], int(i));
    }
  for (const auto& [name, v] : g.outputs()) {
    last[v.node] = INT_MAX;
    last[storage_root(g, v.node)] = INT_MAX;
  }
  return last;
}

MemoryPlan plan_memory(const Graph& g, int dynamic_region) {
  const auto& nodes = g.nodes();
  const std::vector<int> last = last_uses(g);
  MemoryPlan plan;
  plan.offsets.resize(nodes.size());
  struct Buf {
    int node, index;
    int64_t bytes;
    int begin, end;
    int64_t offset = -1;
  };
  std::vector<Buf> bufs;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    plan.offsets[i].assign(n.outputs.size(), -1);
    const bool leaf = n.op == Op::Input || n.op == Op::Param || n.op == Op::Constant;
    if (leaf || is_view_op(n.op) || last[i] == INT_MAX || last[i] < 0) continue;
    if (dynamic_region >= 0 && n.region == dynamic_region) continue;
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      int64_t bytes = (int64_t(n.outputs[k].nbytes()) + 63) / 64 * 64;
      bufs.push_back({int(i), int(k), bytes, int(i), last[i]});
      plan.placed_bytes += bytes;
    }
  }
  plan.buffers = int64_t(bufs.size());
  // Greedy by size: biggest first, each at the lowest offset that fits beside the already
  // placed buffers whose lifetimes overlap its own.
  std::vector<int> order(bufs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return bufs[a].bytes > bufs[b].bytes; });
  std::vector<int> placed;
  std::vector<std::pair<int64_t, int64_t>> busy;
  for (int bi : order) {
    Buf& b = bufs[bi];
    busy.clear();
    for (int pi : placed) {
      const Buf& p = bufs[pi];
      if (p.begin <= b.end && b.begin <= p.end) busy.push_back({p.offset, p.offset + p.bytes});
    }
    std::sort(busy.begin(), busy.end());
    int64_t offset = 0;
    for (const auto& [lo, hi] : busy) {
      if (offset + b.bytes <= lo) break;
      offset = std::max(offset, hi);
    }
    b.offset = offset;
    plan.arena_bytes = std::max(plan.arena_bytes, offset + b.bytes);
    plan.offsets[b.node][b.index] = offset;
    placed.push_back(bi);
  }
  return plan;
}

}  // namespace fusetune
