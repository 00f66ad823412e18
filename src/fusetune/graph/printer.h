#pragma once
// Human-readable dump of a graph, one node per line:
//   %12 = matmul(%3, %7) trans_b -> [256, 512] F32 {model}
#include <string>

#include "fusetune/graph/graph.h"

namespace fusetune {

std::string print_graph(const Graph& g);
std::string value_str(Value v);  // "%12" or "%12.1"

}  // namespace fusetune
