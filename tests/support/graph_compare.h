#pragma once
// Helpers the compile-pass tests share: how many nodes of an op a graph holds, with
// tensor_checks.h (how far a tensor is from a reference, seeded random inputs).
#include "fusetune/graph/graph.h"
#include "tensor_checks.h"

namespace fusetune::testing {

inline int count_ops(const Graph& g, Op op) {
  int n = 0;
  for (const Node& node : g.nodes()) n += node.op == op;
  return n;
}

}  // namespace fusetune::testing
