#include "fusetune/graph/verifier.h"

#include "fusetune/graph/printer.h"
#include "fusetune/util/error.h"

namespace fusetune {

void verify_graph(const Graph& g) {
  const auto& nodes = g.nodes();
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    const std::string where = "graph node %" + std::to_string(i) + " (" + op_name(n.op) + ")";
    for (const Value& v : n.inputs) {
      FT_CHECK(v.node >= 0 && size_t(v.node) < i,
               where + " reads " + value_str(v) + ", which is not an earlier node");
      FT_CHECK(v.index >= 0 && size_t(v.index) < nodes[v.node].outputs.size(),
               where + " reads a missing output " + value_str(v));
    }
    FT_CHECK(!n.outputs.empty(), where + " has no outputs");
    switch (n.op) {
      case Op::Input:
      case Op::Fill:
        break;
      case Op::Param:
        FT_CHECK(!n.name.empty(), where + " is a parameter without a name");
        break;
      case Op::Constant:
        FT_CHECK(n.constant.defined() && n.constant.shape() == n.outputs[0].shape,
                 where + " constant does not match its type");
        break;
      default: {
        auto expect = infer_types(g, n.op, n.inputs, n.attrs);
        FT_CHECK(expect.size() == n.outputs.size(), where + " has the wrong number of outputs");
        for (size_t k = 0; k < expect.size(); ++k)
          FT_CHECK(expect[k].shape == n.outputs[k].shape && expect[k].dtype == n.outputs[k].dtype,
                   where + " output " + std::to_string(k) + " is recorded as " +
                       shape_str(n.outputs[k].shape) + " but infers to " +
                       shape_str(expect[k].shape));
      }
    }
  }
  for (const auto& [name, v] : g.outputs())
    FT_CHECK(v.node >= 0 && size_t(v.node) < nodes.size(),
             "graph output '" + name + "' refers to a missing node");
}

}  // namespace fusetune
