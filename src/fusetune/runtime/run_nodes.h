#pragma once
// The node loop both executors share: nodes in graph order, leaves bound by name, views
// aliasing their input, one kernel per other node, each value dropped after its last direct
// reader (graph outputs are kept and returned). Only where outputs live differs: the caller's
// `allocate` decides (a fresh allocation in eager, an arena slot in a compiled plan), and so
// does where kernels keep their temporaries (`scratch`: none in eager). With
// `on_output` (executor.h), each graph output is handed over as soon as it is computed.
#include <functional>
#include <vector>

#include "fusetune/graph/graph.h"
#include "fusetune/runtime/executor.h"
#include "fusetune/runtime/node_kernels.h"

namespace fusetune {

// Per node, the index of its last direct reader; INT_MAX for graph outputs; -1 when unread.
std::vector<int> release_points(const Graph& g);

using AllocateOutput = std::function<Tensor(size_t node, size_t output, const TensorType& type)>;

// A fresh buffer for output `type` of `n` outside any arena: an embedding's gradient reuses a
// freed buffer whose row set is known when there is one (so its backward zeroes those rows
// only, kernels/cpu/embedding_rows.h); everything else is Tensor::empty.
Tensor fresh_output(const Node& n, const TensorType& type);

std::vector<Tensor> run_nodes(const Graph& g, const std::vector<int>& release_at,
                              const TensorMap& inputs, const ParamSource& params,
                              const AllocateOutput& allocate, const OnOutput& on_output = {},
                              const NodeScratch& scratch = {});

}  // namespace fusetune
