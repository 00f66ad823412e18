#pragma once
// What recipes run a step with: the eager executor or a compiled plan, behind one interface.
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "fusetune/graph/graph.h"
#include "fusetune/runtime/tensor.h"

namespace fusetune {

using TensorMap = std::unordered_map<std::string, Tensor>;

// Called as soon as graph output `index` has been computed, in node order (optimizer_in_bwd:
// a parameter's update right after its gradient). Returning true takes the value: the executor
// keeps no reference to it once no later node reads it (so its buffer is freed when the
// caller drops it), and run() returns an undefined tensor in its place.
using OnOutput = std::function<bool(size_t index, const Tensor& value)>;

class Executor {
 public:
  virtual ~Executor() = default;
  // Binds Op::Input nodes from `inputs` and Op::Param nodes from `params` by name; returns the
  // graph outputs in order.
  virtual std::vector<Tensor> run(const TensorMap& inputs, const TensorMap& params,
                                  const OnOutput& on_output) = 0;
  std::vector<Tensor> run(const TensorMap& inputs, const TensorMap& params) {
    return run(inputs, params, OnOutput{});
  }
  // The graph as it runs (after the compiler's passes).
  virtual const Graph& graph() const = 0;
};

}  // namespace fusetune
