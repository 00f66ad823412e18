#pragma once
// What recipes run a step with: the eager executor or a compiled plan, behind one interface.
#include <string>
#include <unordered_map>
#include <vector>

#include "fusetune/runtime/tensor.h"

namespace fusetune {

using TensorMap = std::unordered_map<std::string, Tensor>;

class Executor {
 public:
  virtual ~Executor() = default;
  // Binds Op::Input nodes from `inputs` and Op::Param nodes from `params` by name; returns the
  // graph outputs in order.
  virtual std::vector<Tensor> run(const TensorMap& inputs, const TensorMap& params) = 0;
};

}  // namespace fusetune
