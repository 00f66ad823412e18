#include <chrono>

#include "fusetune/runtime/eager_executor.h"

#include <climits>

#include "fusetune/runtime/node_kernels.h"
#include "fusetune/runtime/op_profile.h"
#include "fusetune/util/error.h"

namespace fusetune {

const Tensor& bind_leaf(const Node& n, const TensorMap& inputs, const TensorMap& params) {
  const TensorMap& m = n.op == Op::Param ? params : inputs;
  const char* kind = n.op == Op::Param ? "parameter" : "input";
  auto it = m.find(n.name);
  FT_CHECK(it != m.end(), std::string("no tensor bound for graph ") + kind + " '" + n.name + "'");
  const Tensor& t = it->second;
  FT_CHECK(t.shape() == n.outputs[0].shape && t.dtype() == n.outputs[0].dtype,
           std::string(kind) + " '" + n.name + "' is " + shape_str(t.shape()) + " " + dtype_name(t.dtype()) +
               " but the graph expects " + shape_str(n.outputs[0].shape) + " " + dtype_name(n.outputs[0].dtype));
  return t;
}

EagerExecutor::EagerExecutor(const Graph& g) : g_(g), last_use_(g.nodes().size(), -1) {
  for (size_t i = 0; i < g.nodes().size(); ++i)
    for (const Value& v : g.nodes()[i].inputs) last_use_[v.node] = int(i);
  for (const auto& [name, v] : g.outputs()) last_use_[v.node] = INT_MAX;
}

std::vector<Tensor> EagerExecutor::run(const TensorMap& inputs, const TensorMap& params) {
  const auto& nodes = g_.nodes();
  std::vector<std::vector<Tensor>> values(nodes.size());
  std::vector<Tensor> in;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    if (last_use_[i] < 0 && n.op != Op::Param && n.op != Op::Input) continue;  // dead code
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
          for (const auto& t : n.outputs) out.push_back(Tensor::empty(t.shape, t.dtype));
          if (op_profile::enabled()) {
            const auto t0 = std::chrono::steady_clock::now();
            run_node_kernel(g_, n, in, out);
            double bytes = 0;
            for (const auto& t : out) bytes += double(t.nbytes());
            op_profile::add(n.op, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), bytes);
          } else {
            run_node_kernel(g_, n, in, out);
          }
        }
        values[i] = std::move(out);
        in.clear();
      }
    }
    // Release every value whose last reader was this node.
    for (const Value& v : n.inputs)
      if (last_use_[v.node] == int(i)) values[v.node].clear();
  }
  std::vector<Tensor> result;
  for (const auto& [name, v] : g_.outputs()) result.push_back(values[v.node][v.index]);
  return result;
}

}  // namespace fusetune
