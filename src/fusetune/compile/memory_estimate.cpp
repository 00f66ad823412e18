#include "fusetune/compile/memory_estimate.h"

#include <algorithm>
#include <climits>
#include <map>
#include <set>
#include <string>

#include "fusetune/graph/op_desc.h"
#include "fusetune/runtime/bf16_node_kernels.h"
#include "fusetune/runtime/node_kernels.h"

namespace fusetune {

namespace {

// A fused head's kept logits (graph.h), held from its forward to their one reader, the head's
// backward, outside the arena: the kernel's working block, as the scratch they replace was, so
// counted as workspace, not activations.
struct EstimateKeptLogits {
  std::vector<int64_t> bytes;  // per node: its kept logits still held
  int64_t live = 0;
  explicit EstimateKeptLogits(size_t nodes) : bytes(nodes, 0) {}
  void produced(const Node& n, size_t i) {
    if (n.outputs.size() > 3 && is_kept_head_logits(n, 3))
      live += bytes[i] = int64_t(n.outputs[3].nbytes());
  }
  // After node n has run: the bytes of the kept logits it read, freed (and taken off `held`).
  int64_t release_read_by(const Graph& g, const Node& n, std::vector<int64_t>& held) {
    int64_t freed = 0;
    for (const Value& v : n.inputs) {
      const auto j = size_t(v.node);
      if (bytes[j] == 0 || !is_kept_head_logits(g.nodes()[j], v.index)) continue;
      held[j] -= bytes[j];
      freed += bytes[j];
      forget(j);
    }
    return freed;
  }
  void forget(size_t j) {
    live -= bytes[j];
    bytes[j] = 0;
  }
};

}  // namespace

GradientFreed all_gradients() {
  return [](const std::string&) { return true; };
}

MemoryBreakdown estimate_step_memory(const Graph& g, const MemoryPlan* plan,
                                     const OptimizerStateSize& optimizer_state,
                                     const GradientFreed& freed_early,
                                     const GatheredParam& gathered) {
  MemoryBreakdown m;
  const auto& nodes = g.nodes();
  std::set<const void*> constants;  // graph-owned weights (NF4 base), each storage once
  std::vector<bool> is_gathered(nodes.size(), false);
  std::set<std::string> named;  // params_at_use may give a parameter a second (backward) leaf
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    if (n.op == Op::Param) {
      is_gathered[i] = gathered && gathered(n.name);
      if (!named.insert(n.name).second) continue;
      if (!is_gathered[i]) m.parameters += int64_t(n.outputs[0].nbytes());
      if (n.trainable)
        m.optimizer_state +=
            optimizer_state.bytes(n.outputs[0].numel(), int64_t(n.outputs[0].nbytes()));
    } else if (n.op == Op::Constant && n.constant.defined() &&
               constants.insert(n.constant.raw()).second) {
      m.parameters += int64_t(n.constant.nbytes());
    }
  }
  for (const auto& [name, v] : g.outputs())
    if (name.rfind("grad:", 0) == 0) m.gradients += int64_t(g.type(v).nbytes());
  // The gradients handed over (and freed) as soon as their node has run, by the node holding
  // their buffer (views followed to their source); the others are held to the end.
  std::vector<std::vector<int>> applied_after(nodes.size());
  std::vector<bool> is_gradient(nodes.size(), false);
  int64_t gradients_held = 0, gradients_at_peak = 0;
  if (freed_early) {
    const std::vector<bool> early = early_update_outputs(g);
    for (size_t k = 0; k < g.outputs().size(); ++k) {
      const auto& [name, v] = g.outputs()[k];
      if (name.rfind("grad:", 0) != 0) continue;
      int root = v.node;
      while (is_view_op(nodes[size_t(root)].op)) root = nodes[size_t(root)].inputs[0].node;
      is_gradient[size_t(root)] = true;
      if (early[k] && freed_early(name.substr(5))) applied_after[size_t(v.node)].push_back(root);
    }
  }

  // Replay the step's allocations in node order, as the executors make them.
  const std::vector<int> last = last_uses(g);
  std::vector<int64_t> held(nodes.size(), 0);
  EstimateKeptLogits kept(nodes.size());
  std::vector<std::vector<int>> freed_after(nodes.size());  // buffers whose last reader is node i
  for (size_t j = 0; j < nodes.size(); ++j)
    if (last[j] >= 0 && last[j] != INT_MAX) freed_after[size_t(last[j])].push_back(int(j));
  // `peak` leaves the gathered buffers out: they come from a pool (distributed/gather_pool.h) that
  // keeps, per byte size, the most buffers ever live at once, added once at the end.
  int64_t live = plan ? plan->arena_bytes : 0, peak = live;
  int64_t gathered_live = 0;
  std::map<int64_t, int> gathered_count, pooled_count;  // by byte size: live now, most at once
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    const bool leaf = n.op == Op::Input || n.op == Op::Param || n.op == Op::Constant;
    if (!leaf && !is_view_op(n.op) && last[i] >= 0) {
      for (size_t k = 0; k < n.outputs.size(); ++k)
        if (!plan || plan->offsets[i][k] < 0) held[i] += int64_t(n.outputs[k].nbytes());
      live += held[i];
      if (is_gradient[i]) gradients_held += held[i];
      kept.produced(n, i);
    }
    if (is_gathered[i]) {
      // Bound even when unread (then kept to the end of the step, as the executors do).
      held[i] = int64_t(n.outputs[0].nbytes());
      live += held[i];
      gathered_live += held[i];
      const int c = ++gathered_count[held[i]];
      pooled_count[held[i]] = std::max(pooled_count[held[i]], c);
    }
    // Kernel scratch (counted tensors the kernel allocates and frees while it runs).
    const OpDesc& d = op_desc(n.op);
    int64_t scratch = d.scratch_bytes ? d.scratch_bytes(g, n) : 0;
    // dtype: bf16 widens inputs and rounds outputs through fp32 scratch: the arena's scratch
    // slice (already live) where it fits, else a buffer for the node (always in eager mode).
    const int64_t conversions = bf16_conversion_scratch_bytes(g, n);
    if (!plan || conversions > plan->scratch_bytes) scratch += conversions;
    // Leaves and views run no kernel (a bf16 parameter is bound, not widened); dead nodes never
    // run.
    if (leaf || is_view_op(n.op) || last[i] < 0) scratch = 0;
    if (live - gathered_live + scratch > peak) {
      gradients_at_peak = gradients_held;
      m.workspace = scratch + kept.live;  // the scratch held at the peak, not the largest anywhere
      m.peak_node = int(i);
    }
    peak = std::max(peak, live - gathered_live + scratch);
    live -= kept.release_read_by(g, n, held);
    for (int j : freed_after[i]) {
      live -= held[size_t(j)];
      kept.forget(size_t(j));
      if (is_gathered[size_t(j)] && held[size_t(j)] > 0) {
        gathered_live -= held[size_t(j)];
        --gathered_count[held[size_t(j)]];
      }
      held[size_t(j)] = 0;
    }
    for (int j : applied_after[i]) {
      live -= held[size_t(j)];
      gradients_held -= held[size_t(j)];
      held[size_t(j)] = 0;
    }
  }
  if (plan) m.workspace += plan->scratch_bytes;  // inside the arena, live throughout
  for (const auto& [bytes, count] : pooled_count) m.gathered += bytes * count;
  peak += m.gathered;
  if (freed_early) m.gradients = gradients_at_peak;
  m.activations = std::max<int64_t>(0, peak - m.gradients - m.workspace - m.gathered);
  return m;
}

}  // namespace fusetune
