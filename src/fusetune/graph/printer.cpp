#include "fusetune/graph/printer.h"

#include <sstream>

namespace fusetune {

std::string value_str(Value v) {
  std::string s = "%" + std::to_string(v.node);
  if (v.index) s += "." + std::to_string(v.index);
  return s;
}

std::string print_graph(const Graph& g) {
  std::ostringstream os;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    os << "%" << i << " = " << op_name(n.op) << "(";
    for (size_t j = 0; j < n.inputs.size(); ++j) os << (j ? ", " : "") << value_str(n.inputs[j]);
    os << ")";
    if (!n.name.empty()) os << " '" << n.name << "'";
    if (n.op == Op::Param) os << (n.trainable ? " trainable" : " frozen");
    if (n.attrs.trans_a) os << " trans_a";
    if (n.attrs.trans_b) os << " trans_b";
    os << " ->";
    for (const auto& t : n.outputs) os << " " << shape_str(t.shape) << " " << dtype_name(t.dtype);
    os << (n.region ? " {loss}" : " {model}") << "\n";
  }
  for (const auto& [name, v] : g.outputs())
    os << "output " << name << " = " << value_str(v) << "\n";
  return os.str();
}

}  // namespace fusetune
