#include "fusetune/distributed/sharded_params.h"

#include <algorithm>
#include <set>

#include "fusetune/distributed/sharded_optimizer.h"
#include "fusetune/util/error.h"

namespace fusetune::dist {

ShardedParams::ShardedParams(Communicator& comm, TensorMap& params,
                             const std::vector<std::string>& trainable,
                             const std::map<std::string, Tensor*>& frozen_elsewhere)
    : comm_(comm) {
  const std::set<std::string> trained(trainable.begin(), trainable.end());
  // Every tensor by name: the map's entries stay put (release_others undefines, never erases).
  std::map<std::string, Tensor*> values = frozen_elsewhere;
  for (auto& [name, t] : params)
    FT_CHECK(values.emplace(name, &t).second,
             "ZeRO-3: '" + name + "' is both a parameter and stored elsewhere");
  // Trainable and frozen tensors are partitioned separately, each in name order: the trainable
  // ones exactly as ShardedOptimizer and OwnedGradients partition them.
  std::vector<std::string> names[2];
  for (const auto& [name, t] : values) names[trained.count(name) ? 0 : 1].push_back(name);
  for (auto& group : names) {
    std::vector<int64_t> numels;
    for (const std::string& name : group) numels.push_back(values.at(name)->numel());
    const std::vector<int> owner = partition_by_elements(numels, comm_.size());
    for (size_t i = 0; i < group.size(); ++i) {
      Tensor* t = values.at(group[i]);
      meta_[group[i]] = {owner[i], t->shape(), t->dtype(), t};
    }
  }
}

void ShardedParams::release_others() {
  for (const auto& [name, m] : meta_)
    if (m.owner != comm_.rank()) *m.value = Tensor();
}

Tensor ShardedParams::acquire(const std::string& name) {
  auto it = meta_.find(name);
  FT_CHECK(it != meta_.end(), "ZeRO-3: no parameter '" + name + "'");
  const Meta& m = it->second;
  Tensor t = m.owner == comm_.rank() ? *m.value : pool_.take(m.shape, m.dtype);
  FT_CHECK(t.defined(), "ZeRO-3: rank " + std::to_string(comm_.rank()) + " owns '" + name +
                            "' but holds no value for it");
  if (comm_.size() > 1)
    comm_.broadcast(t.raw(), int64_t(t.nbytes()), m.owner,
                    "the parameter gather (ZeRO-3) of " + name);
  return t;
}

void ShardedParams::gather_to_rank0(const std::string& what,
                                    const std::function<bool(const std::string&)>& needed) {
  if (comm_.size() == 1) return;
  pool_.trim();  // rank 0 is about to hold the whole model
  for (const auto& [name, m] : meta_) {
    if (m.owner == 0 || (needed && !needed(name))) continue;
    if (comm_.rank() == 0) {
      Tensor t = Tensor::empty(m.shape, m.dtype);
      comm_.recv(t.raw(), int64_t(t.nbytes()), m.owner, what);
      *m.value = std::move(t);
    } else if (m.owner == comm_.rank()) {
      comm_.send(m.value->raw(), int64_t(m.value->nbytes()), 0, what);
    }
  }
}

}  // namespace fusetune::dist
