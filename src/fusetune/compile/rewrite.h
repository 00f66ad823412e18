#pragma once
// Tools passes use to edit a graph: redirect uses, then compact (drop dead nodes and restore
// topological order). Passes append new nodes at the end and give each an order key, the
// position it should take among the original nodes; compact() honours keys wherever the
// dependencies allow, so a rewrite does not reshuffle the schedule it did not touch.
#include <unordered_map>

#include "fusetune/graph/graph.h"

namespace fusetune {

// Every node input and graph output reading `from` reads `to` instead.
void replace_all_uses(Graph& g, Value from, Value to);

// Removes nodes that no graph output depends on, then re-sorts topologically by order key
// (a node's own index unless `order_keys` gives one). Values are renumbered.
void compact(Graph& g, const std::unordered_map<int, double>& order_keys = {});

// Number of nodes reading each node (any output), graph outputs counted as readers.
std::vector<int> use_counts(const Graph& g);

// The nodes reading each node (any output), in order; a node reading twice is listed twice.
std::vector<std::vector<int>> readers_of(const Graph& g);

// Whether some graph output is an output of `node`.
bool is_graph_output(const Graph& g, int node);

}  // namespace fusetune
