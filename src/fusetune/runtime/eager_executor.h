#pragma once
// The eager executor: the honest PyTorch-eager baseline. One kernel per node, in graph order,
// every output materialized in its own allocation and released right after its last use
// (as reference counting does). Peak memory is what the counters in memory.h see.
#include <string>
#include <unordered_map>
#include <vector>

#include "fusetune/graph/graph.h"
#include "fusetune/runtime/executor.h"

namespace fusetune {

class EagerExecutor : public Executor {
 public:
  explicit EagerExecutor(const Graph& g);

  // Runs the graph. `inputs` binds Op::Input nodes by name, `params` binds Op::Param nodes by
  // name or from a callback (dtype must equal the graph's float dtype). Returns the graph outputs,
  // in order.
  std::vector<Tensor> run(const TensorMap& inputs, const ParamSource& params,
                          const OnOutput& on_output) override;
  using Executor::run;
  const Graph& graph() const override { return g_; }

 private:
  Graph g_;  // a copy: cheap (constants share storage) and the executor cannot dangle
  std::vector<int> release_at_;  // see release_points()
};

// Looks up (or, from a callback ParamSource, acquires) a bound tensor and checks shape and dtype
// against the graph, naming it on mismatch.
Tensor bind_leaf(const Node& n, const TensorMap& inputs, const ParamSource& params);

}  // namespace fusetune
