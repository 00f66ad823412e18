#include "fusetune/runtime/run_nodes.h"

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

namespace {

void run_kernel(const Graph& g, const Node& n, const std::vector<Tensor>& in,
                std::vector<Tensor>& out) {
  if (!op_profile::enabled()) return run_node_kernel(g, n, in, out);
  const auto t0 = std::chrono::steady_clock::now();
  run_node_kernel(g, n, in, out);
  double bytes = 0;
  for (const auto& t : out) bytes += double(t.nbytes());
  op_profile::add(
      n.op, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), bytes);
}

}  // namespace

std::vector<Tensor> run_nodes(const Graph& g, const std::vector<int>& release_at,
                              const TensorMap& inputs, const TensorMap& params,
                              const AllocateOutput& allocate) {
  const auto& nodes = g.nodes();
  std::vector<std::vector<Tensor>> values(nodes.size());
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
          run_kernel(g, n, in, out);
        }
        values[i] = std::move(out);
        in.clear();
      }
    }
    for (const Value& v : n.inputs)
      if (release_at[v.node] == int(i)) values[v.node].clear();
  }
  std::vector<Tensor> result;
  for (const auto& [name, v] : g.outputs()) result.push_back(values[v.node][v.index]);
  return result;
}

}  // namespace fusetune
