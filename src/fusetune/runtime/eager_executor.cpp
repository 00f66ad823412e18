#include "fusetune/runtime/eager_executor.h"

#include "fusetune/runtime/run_nodes.h"
#include "fusetune/util/error.h"

namespace fusetune {

Tensor bind_leaf(const Node& n, const TensorMap& inputs, const ParamSource& params) {
  const bool param = n.op == Op::Param;
  const char* kind = param ? "parameter" : "input";
  Tensor t;
  if (param && !params.map()) {
    t = params.acquire(n.name);
  } else {
    const TensorMap& m = param ? *params.map() : inputs;
    auto it = m.find(n.name);
    FT_CHECK(it != m.end(), std::string("no tensor bound for graph ") + kind + " '" + n.name + "'");
    t = it->second;
  }
  FT_CHECK(t.shape() == n.outputs[0].shape && t.dtype() == n.outputs[0].dtype,
           std::string(kind) + " '" + n.name + "' is " + shape_str(t.shape()) + " " +
               dtype_name(t.dtype()) + " but the graph expects " + shape_str(n.outputs[0].shape) +
               " " + dtype_name(n.outputs[0].dtype));
  return t;
}

EagerExecutor::EagerExecutor(const Graph& g) : g_(g), release_at_(release_points(g_)) {}

std::vector<Tensor> EagerExecutor::run(const TensorMap& inputs, const ParamSource& params,
                                       const OnOutput& on_output) {
  return run_nodes(
      g_, release_at_, inputs, params,
      [this](size_t node, size_t, const TensorType& t) {
        return fresh_output(g_.nodes()[node], t);
      },
      on_output);
}

}  // namespace fusetune
