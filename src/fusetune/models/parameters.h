#pragma once
// Parameter tensors by Hugging Face name, and their seeded random initialization (the
// embedded demo starts from one). The set of parameters is read off the graph's Param nodes,
// so it can never disagree with the model definition.
#include <cstdint>
#include <string>
#include <vector>

#include "fusetune/graph/graph.h"
#include "fusetune/models/param_sink.h"
#include "fusetune/runtime/eager_executor.h"

namespace fusetune {

struct ParamInfo {
  std::string name;
  Shape shape;
  bool trainable = false;
};

std::vector<ParamInfo> graph_parameters(const Graph& g);

// Normal(0, std) for matrices and embeddings, ones for norm weights, zeros for biases, like
// Hugging Face's _init_weights with initializer_range = std. Counter-based: element i of
// parameter `name` is a function of (seed, name, i) alone (SplitMix64 of the counter, then
// Box-Muller in float), so the values do not depend on the thread count, on the order of the
// parameters or on which others exist. The values are F32: `dtype` F32 and F64 hold them
// exactly, BF16 / F16 rounded to nearest. Each tensor is written in its dtype directly
// (OpenMP over blocks of elements), never through a float copy of another width.
// Parameters `sink` takes are handed to it one at a time, produced as F32 a range of
// elements at a time as it asks (never whole), and left out of the result.
// norms_at_zero: norm weights start at 0 instead, for a family whose norms scale by (1 + w)
// (Gemma: an effective scale of 1, as transformers initializes it).
TensorMap init_parameters(const std::vector<ParamInfo>& params, uint64_t seed, DType dtype,
                          double std = 0.02, ParamSink* sink = nullptr, bool norms_at_zero = false);

// One parameter's initial values (as init_parameters gives them) written into `out`, a
// float tensor (F32, F64, BF16 or F16) shaped like the parameter: for writers that produce a
// model tensor by tensor.
void init_parameter(const std::string& name, uint64_t seed, double std, Tensor& out,
                    bool norms_at_zero = false);

}  // namespace fusetune
