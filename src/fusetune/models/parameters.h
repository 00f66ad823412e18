#pragma once
// Parameter tensors by Hugging Face name, and their seeded random initialization (the
// embedded demo starts from one). The set of parameters is read off the graph's Param nodes,
// so it can never disagree with the model definition.
#include <cstdint>
#include <string>
#include <vector>

#include "fusetune/graph/graph.h"
#include "fusetune/runtime/eager_executor.h"

namespace fusetune {

struct ParamInfo {
  std::string name;
  Shape shape;
  bool trainable = false;
};

std::vector<ParamInfo> graph_parameters(const Graph& g);

// Normal(0, std) for matrices and embeddings, ones for norm weights, zeros for biases, like
// Hugging Face's _init_weights with initializer_range = std. Deterministic in `seed`.
TensorMap init_parameters(const std::vector<ParamInfo>& params, uint64_t seed, DType dtype,
                          double std = 0.02);

}  // namespace fusetune
