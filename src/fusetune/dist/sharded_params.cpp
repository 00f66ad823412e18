#include "fusetune/dist/sharded_params.h"

#include <algorithm>
#include <set>

#include "fusetune/dist/sharded_optimizer.h"
#include "fusetune/util/error.h"

namespace fusetune::dist {

ShardedParams::ShardedParams(Communicator& comm, TensorMap& params,
                             const std::vector<std::string>& trainable)
    : comm_(comm), params_(params) {
  const std::set<std::string> trained(trainable.begin(), trainable.end());
  // Trainable and frozen parameters are partitioned separately, each in name order: the
  // trainable ones exactly as ShardedOptimizer and OwnedGradients partition them.
  std::vector<std::string> names[2];
  for (const auto& [name, t] : params) names[trained.count(name) ? 0 : 1].push_back(name);
  for (auto& group : names) {
    std::sort(group.begin(), group.end());
    std::vector<int64_t> numels;
    for (const std::string& name : group) numels.push_back(params.at(name).numel());
    const std::vector<int> owner = partition_by_elements(numels, comm_.size());
    for (size_t i = 0; i < group.size(); ++i) {
      const Tensor& t = params.at(group[i]);
      meta_[group[i]] = {owner[i], t.shape(), t.dtype()};
    }
  }
}

void ShardedParams::release_others() {
  for (const auto& [name, m] : meta_)
    if (m.owner != comm_.rank()) params_[name] = Tensor();
}

Tensor ShardedParams::acquire(const std::string& name) {
  auto it = meta_.find(name);
  FT_CHECK(it != meta_.end(), "ZeRO-3: no parameter '" + name + "'");
  const Meta& m = it->second;
  Tensor t = m.owner == comm_.rank() ? params_.at(name) : Tensor::empty(m.shape, m.dtype);
  FT_CHECK(t.defined(), "ZeRO-3: rank " + std::to_string(comm_.rank()) + " owns '" + name +
                            "' but holds no value for it");
  if (comm_.size() > 1)
    comm_.broadcast(t.raw(), int64_t(t.nbytes()), m.owner,
                    "the parameter gather (ZeRO-3) of " + name);
  return t;
}

void ShardedParams::gather_to_rank0(const std::string& what) {
  if (comm_.size() == 1) return;
  for (const auto& [name, m] : meta_) {
    if (m.owner == 0) continue;
    if (comm_.rank() == 0) {
      Tensor t = Tensor::empty(m.shape, m.dtype);
      comm_.recv(t.raw(), int64_t(t.nbytes()), m.owner, what);
      params_[name] = std::move(t);
    } else if (m.owner == comm_.rank()) {
      const Tensor& t = params_.at(name);
      comm_.send(t.raw(), int64_t(t.nbytes()), 0, what);
    }
  }
}

}  // namespace fusetune::dist
