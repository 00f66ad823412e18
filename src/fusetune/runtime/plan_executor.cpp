#include <chrono>

#include "fusetune/runtime/plan_executor.h"

#include <climits>

#include "fusetune/runtime/eager_executor.h"
#include "fusetune/runtime/node_kernels.h"
#include "fusetune/runtime/op_profile.h"

namespace fusetune {

PlanExecutor::PlanExecutor(Graph g, MemoryPlan plan)
    : g_(std::move(g)), plan_(std::move(plan)), last_use_(last_uses(g_)) {
  arena_ = Tensor::empty({(plan_.arena_bytes + 3) / 4}, DType::F32);
  direct_last_.assign(g_.nodes().size(), -1);
  for (size_t i = 0; i < g_.nodes().size(); ++i)
    for (const Value& v : g_.nodes()[i].inputs) direct_last_[v.node] = int(i);
}

std::vector<Tensor> PlanExecutor::run(const TensorMap& inputs, const TensorMap& params) {
  const auto& nodes = g_.nodes();
  std::vector<std::vector<Tensor>> values(nodes.size());
  std::vector<Tensor> in;
  char* base = static_cast<char*>(arena_.raw());
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    if (last_use_[i] < 0 && n.op != Op::Param && n.op != Op::Input) continue;
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
          for (size_t k = 0; k < n.outputs.size(); ++k) {
            const TensorType& t = n.outputs[k];
            const int64_t off = plan_.offsets[i][k];
            out.push_back(off >= 0 ? Tensor::borrow(base + off, t.shape, t.dtype, nullptr)
                                   : Tensor::empty(t.shape, t.dtype));
          }
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
    for (const Value& v : n.inputs)
      if (direct_last_[v.node] == int(i) && last_use_[v.node] != INT_MAX) values[v.node].clear();
  }
  std::vector<Tensor> result;
  for (const auto& [name, v] : g_.outputs()) result.push_back(values[v.node][v.index]);
  return result;
}

}  // namespace fusetune
