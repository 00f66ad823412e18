#pragma once
// Checks the invariants every pass must keep: topological order, valid references, and
// recorded types equal to what shape inference says. Throws fusetune::Error naming the node.
#include "fusetune/graph/graph.h"

namespace fusetune {

void verify_graph(const Graph& g);

}  // namespace fusetune
