#include "fusetune/compile/memory_plan.h"

#include <algorithm>
#include <climits>
#include <map>
#include <string>

#include "fusetune/runtime/bf16_node_kernels.h"
#include "fusetune/runtime/node_kernels.h"

namespace fusetune {
namespace {

// The node whose buffer a value really lives in (following view chains).
int storage_root(const Graph& g, int node) {
  while (is_view_op(g.nodes()[node].op)) node = g.nodes()[node].inputs[0].node;
  return node;
}

// The buffer a value really lives in: the same, following views to their source output.
Value storage_value(const Graph& g, Value v) {
  while (is_view_op(g.node(v).op)) v = g.node(v).inputs[0];
  return v;
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

std::vector<bool> early_update_outputs(const Graph& g) {
  const std::vector<int> last = last_uses(g);
  // The last node reading each buffer (node, output; views followed to their source), graph
  // outputs or not.
  std::map<std::pair<int, int>, int> last_reader;
  for (size_t i = 0; i < g.nodes().size(); ++i)
    for (const Value& v : g.nodes()[i].inputs) {
      const Value root = storage_value(g, v);
      int& r = last_reader[{root.node, root.index}];
      r = std::max(r, int(i));
    }
  std::vector<bool> early;
  for (const auto& [name, v] : g.outputs()) {
    bool ok = false;
    if (name.rfind("grad:", 0) == 0) {
      const std::string param = name.substr(5);
      const Value root = storage_value(g, v);
      const auto read = last_reader.find({root.node, root.index});
      ok = read == last_reader.end() || read->second <= int(v.node);
      for (size_t i = 0; i < g.nodes().size(); ++i)
        if (g.nodes()[i].op == Op::Param && g.nodes()[i].name == param && last[i] > int(v.node))
          ok = false;
    }
    early.push_back(ok);
  }
  return early;
}

namespace {

// The largest scratch, up to kScratchSliceCap, that a node running a kernel takes (leaves are
// bound, views alias, dead nodes never run).
int64_t node_scratch_bytes(const Graph& g) {
  const std::vector<int> last = last_uses(g);
  int64_t most = 0;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    const bool leaf = n.op == Op::Input || n.op == Op::Param || n.op == Op::Constant;
    if (leaf || is_view_op(n.op) || last[i] < 0) continue;
    const int64_t need = bf16_conversion_scratch_bytes(g, n);
    if (need <= kScratchSliceCap) most = std::max(most, need);
  }
  return most;
}

MemoryPlan plan_memory_once(const Graph& g, int dynamic_region, bool in_place) {
  const auto& nodes = g.nodes();
  const std::vector<int> last = last_uses(g);
  MemoryPlan plan;
  plan.offsets.resize(nodes.size());
  plan.writes_over.assign(nodes.size(), -1);
  struct Buf {
    int node, index;
    int64_t bytes;
    int group;  // the in-place group: buffers that share one slot, one after another
  };
  // A group is one slot in the arena, live from its first buffer's producer to its last
  // buffer's last reader.
  struct Group {
    int64_t bytes;
    int begin, end;
    int tail;  // the group's latest buffer
    int64_t offset = -1;
  };
  std::vector<Buf> bufs;
  std::vector<Group> groups;
  std::vector<std::vector<int>> buf_of(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    plan.offsets[i].assign(n.outputs.size(), -1);
    buf_of[i].assign(n.outputs.size(), -1);
    const bool leaf = n.op == Op::Input || n.op == Op::Param || n.op == Op::Constant;
    if (leaf || is_view_op(n.op) || last[i] == INT_MAX || last[i] < 0) continue;
    if (dynamic_region >= 0 && n.region == dynamic_region) continue;
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      // A fused head's kept logits are allocated and freed around the head (graph.h): a slot
      // in the arena would hold them for the whole step and beside every graph sharing it.
      if (is_kept_head_logits(n, k)) continue;
      const int64_t bytes = (int64_t(n.outputs[k].nbytes()) + 63) / 64 * 64;
      int group = -1;
      // Output 0 may take over an input's group when this node is that buffer's last reader.
      for (size_t j = 0; in_place && k == 0 && group < 0 && j < n.inputs.size(); ++j) {
        if (!can_write_over_input(n, int(j))) continue;
        const Value src = storage_value(g, n.inputs[j]);
        const int b = buf_of[src.node][src.index];
        if (b < 0 || last[src.node] != int(i) || bufs[b].bytes != bytes) continue;
        if (nodes[src.node].outputs[src.index].nbytes() != n.outputs[k].nbytes()) continue;
        Group& gr = groups[bufs[b].group];
        if (gr.tail != b || gr.end != int(i)) continue;
        group = bufs[b].group;
        gr.end = last[i];
        gr.tail = int(bufs.size());
        plan.writes_over[i] = src.node;
        ++plan.in_place;
      }
      if (group < 0) {
        group = int(groups.size());
        groups.push_back({bytes, int(i), last[i], int(bufs.size())});
      }
      buf_of[i][k] = int(bufs.size());
      bufs.push_back({int(i), int(k), bytes, group});
      plan.placed_bytes += bytes;
    }
  }
  plan.buffers = int64_t(bufs.size());
  // Greedy by size: biggest first, each at the lowest offset that fits beside the already
  // placed groups whose lifetimes overlap its own.
  std::vector<int> order(groups.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return groups[a].bytes > groups[b].bytes; });
  std::vector<int> placed;
  std::vector<std::pair<int64_t, int64_t>> busy;
  for (int gi : order) {
    Group& b = groups[gi];
    busy.clear();
    for (int pi : placed) {
      const Group& p = groups[pi];
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
    placed.push_back(gi);
  }
  for (const Buf& b : bufs) plan.offsets[b.node][b.index] = groups[b.group].offset;
  return plan;
}

}  // namespace

MemoryPlan plan_memory(const Graph& g, int dynamic_region, bool in_place) {
  MemoryPlan plan = plan_memory_once(g, dynamic_region, false);
  if (in_place) {
    // Sharing a slot joins two lifetimes into one; with greedy placement that can fragment the
    // arena. Keep the in-place plan only when its arena is no larger.
    MemoryPlan shared = plan_memory_once(g, dynamic_region, true);
    if (shared.arena_bytes <= plan.arena_bytes) plan = std::move(shared);
  }
  plan.scratch_bytes = node_scratch_bytes(g);
  if (plan.scratch_bytes > 0) {  // after the last placed buffer, on a cache line
    plan.scratch_offset = (plan.arena_bytes + 63) / 64 * 64;
    plan.arena_bytes = plan.scratch_offset + plan.scratch_bytes;
  }
  return plan;
}

}  // namespace fusetune
