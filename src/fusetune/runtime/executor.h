#pragma once
// What recipes run a step with: the eager executor or a compiled plan, behind one interface.
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "fusetune/core/tensor.h"
#include "fusetune/graph/graph.h"

namespace fusetune {

using TensorMap = std::unordered_map<std::string, Tensor>;

// Where a graph's Op::Param leaves come from when their nodes run: a TensorMap by name (the
// default, implicit from a map: nothing is copied), or a callback that produces the parameter
// right then (ZeRO-3: gathered from the rank that owns it, distributed/sharded_params.h). The
// executor drops its reference after the node's last reader either way, so a produced
// parameter lives only around its uses.
class ParamSource {
 public:
  using Acquire = std::function<Tensor(const std::string& name)>;
  ParamSource() : map_(&empty_map()) {}
  ParamSource(const TensorMap& params) : map_(&params) {}  // NOLINT: implicit on purpose
  explicit ParamSource(Acquire acquire) : acquire_(std::move(acquire)) {}
  // Null when the parameters come from a callback.
  const TensorMap* map() const { return map_; }
  Tensor acquire(const std::string& name) const { return acquire_(name); }

 private:
  static const TensorMap& empty_map() {
    static const TensorMap m;
    return m;
  }
  const TensorMap* map_ = nullptr;
  Acquire acquire_;
};

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
  virtual std::vector<Tensor> run(const TensorMap& inputs, const ParamSource& params,
                                  const OnOutput& on_output) = 0;
  std::vector<Tensor> run(const TensorMap& inputs, const ParamSource& params) {
    return run(inputs, params, OnOutput{});
  }
  // The graph as it runs (after the compiler's passes).
  virtual const Graph& graph() const = 0;
};

}  // namespace fusetune
