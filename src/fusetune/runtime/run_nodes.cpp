#include "fusetune/runtime/run_nodes.h"

#include <algorithm>
#include <chrono>
#include <climits>

#include "fusetune/runtime/eager_executor.h"
#include "fusetune/runtime/node_kernels.h"
#include "fusetune/runtime/op_profile.h"

namespace fusetune {

std::vector<int> release_points(const Graph& g) {
  std::vector<int> last(g.nodes().size(), -1);
  for (size_t i = 0; i < g.nodes().size(); ++i)
    for (const Value& v : g.nodes()[i].inputs) last[v.node] = int(i);
  for (const auto& [name, v] : g.outputs()) last[v.node] = INT_MAX;
  return last;
}

Tensor fresh_output(const Node& n, const TensorType& type) {
  return n.op == Op::EmbeddingBackward ? Tensor::reusing_rows(type.shape, type.dtype)
                                       : Tensor::empty(type.shape, type.dtype);
}

namespace {

void run_kernel(const Graph& g, const Node& n, const std::vector<Tensor>& in,
                std::vector<Tensor>& out, const NodeScratch& scratch) {
  if (!op_profile::enabled()) return run_node_kernel(g, n, in, out, scratch);
  const auto t0 = std::chrono::steady_clock::now();
  run_node_kernel(g, n, in, out, scratch);
  double bytes = 0;
  for (const auto& t : out) bytes += double(t.nbytes());
  op_profile::add(
      n.op, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), bytes);
}

}  // namespace

std::vector<Tensor> run_nodes(const Graph& g, const std::vector<int>& release_at,
                              const TensorMap& inputs, const ParamSource& params,
                              const AllocateOutput& allocate, const OnOutput& on_output,
                              const NodeScratch& scratch) {
  const auto& nodes = g.nodes();
  std::vector<std::vector<Tensor>> values(nodes.size());
  // With on_output: the outputs of each node, how many of a node's outputs are still kept (-1:
  // not an output) and each node's last direct reader, so that a value whose outputs were all
  // taken is dropped at its last reader instead of being kept to the end.
  std::vector<std::vector<size_t>> outputs_at;
  std::vector<int> kept, last_reader;
  std::vector<std::vector<int>> last_reader_of;  // per node output
  if (on_output) {
    outputs_at.resize(nodes.size());
    kept.assign(nodes.size(), -1);
    last_reader.assign(nodes.size(), -1);
    last_reader_of.resize(nodes.size());
    for (size_t i = 0; i < nodes.size(); ++i) last_reader_of[i].assign(nodes[i].outputs.size(), -1);
    size_t k = 0;
    for (const auto& [name, v] : g.outputs()) {
      outputs_at[v.node].push_back(k++);
      kept[v.node] = std::max(kept[v.node], 0) + 1;
    }
    for (size_t i = 0; i < nodes.size(); ++i)
      for (const Value& v : nodes[i].inputs) {
        last_reader[v.node] = int(i);
        last_reader_of[v.node][v.index] = int(i);
      }
  }
  std::vector<bool> taken(g.outputs().size(), false);
  std::vector<Tensor> in;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    if (release_at[i] < 0 && n.op != Op::Param && n.op != Op::Input) continue;  // dead code
    switch (n.op) {
      case Op::Input:
      case Op::Param:
        values[i] = {bind_leaf(n, inputs, params)};
        break;
      case Op::Constant:
        values[i] = {n.constant};
        break;
      default: {
        in.clear();
        for (const Value& v : n.inputs) in.push_back(values[v.node][v.index]);
        std::vector<Tensor> out;
        if (is_view_op(n.op)) {
          out.push_back(in[0].reshape(n.outputs[0].shape));
        } else {
          for (size_t k = 0; k < n.outputs.size(); ++k) out.push_back(allocate(i, k, n.outputs[k]));
          run_kernel(g, n, in, out, scratch);
        }
        values[i] = std::move(out);
        in.clear();
      }
    }
    for (const Value& v : n.inputs)
      if (release_at[v.node] == int(i) ||
          (on_output && kept[v.node] == 0 && last_reader[v.node] == int(i)))
        values[v.node].clear();
    // A fused head's kept logits go with their one reader, the head's backward (graph.h), though
    // the forward's other outputs (its log-probs: a graph output) stay.
    for (const Value& v : n.inputs)
      if (is_kept_head_logits(nodes[v.node], v.index) && !values[v.node].empty())
        values[v.node][v.index] = Tensor();
    if (on_output && !outputs_at[i].empty()) {
      for (size_t k : outputs_at[i]) {
        const int index = g.outputs()[k].second.index;
        if (!on_output(k, values[i][index])) continue;
        taken[k] = true;
        --kept[i];
        // A node's other outputs may be kept (a fused loss node's loss): drop this one alone
        // when nothing reads it later (and no other output is the same value).
        bool again = false;
        for (size_t j : outputs_at[i])
          again |= j != k && g.outputs()[j].second.index == index && (j > k || !taken[j]);
        if (!again && last_reader_of[i][size_t(index)] <= int(i))
          values[i][size_t(index)] = Tensor();
      }
      if (kept[i] == 0 && last_reader[i] <= int(i)) values[i].clear();
    }
  }
  std::vector<Tensor> result;
  size_t k = 0;
  for (const auto& [name, v] : g.outputs())
    result.push_back(taken[k++] ? Tensor() : values[v.node][v.index]);
  return result;
}

}  // namespace fusetune
