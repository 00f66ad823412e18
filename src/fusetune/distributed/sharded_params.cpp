#include "fusetune/distributed/sharded_params.h"

#include <algorithm>
#include <set>

#include "fusetune/distributed/sharded_optimizer.h"
#include "fusetune/util/error.h"

namespace fusetune::dist {

ShardedParams::ShardedParams(Communicator& comm, TensorMap& params,
                             const std::vector<std::string>& trainable,
                             const std::map<std::string, Tensor*>& frozen_elsewhere,
                             const std::map<std::string, HeldByOtherRank>& held_by_others)
    : comm_(comm) {
  const std::set<std::string> trained(trainable.begin(), trainable.end());
  // Every tensor by name: the map's entries stay put (release_others undefines, never erases).
  std::map<std::string, Tensor*> values = frozen_elsewhere;
  for (auto& [name, t] : params)
    FT_CHECK(values.emplace(name, &t).second,
             "ZeRO-3: '" + name + "' is both a parameter and stored elsewhere");
  // Trainable and frozen tensors are partitioned separately, each in name order: the trainable
  // ones exactly as ShardedOptimizer and OwnedGradients partition them.
  for (const auto& [name, h] : held_by_others) {
    FT_CHECK(!values.count(name) && !trained.count(name),
             "ZeRO-3: '" + name + "' is both held here and by another rank");
    values.emplace(name, nullptr);
  }
  std::vector<std::string> names[2];
  for (const auto& [name, t] : values) names[trained.count(name) ? 0 : 1].push_back(name);
  for (auto& group : names) {
    std::vector<int64_t> numels;
    for (const std::string& name : group) {
      const Tensor* t = values.at(name);
      numels.push_back(t ? t->numel() : shape_numel(held_by_others.at(name).shape));
    }
    const std::vector<int> owner = partition_by_elements(numels, comm_.size());
    for (size_t i = 0; i < group.size(); ++i) {
      Tensor* t = values.at(group[i]);
      if (!t) {
        FT_CHECK(owner[i] != comm_.rank(), "ZeRO-3: rank " + std::to_string(comm_.rank()) +
                                               " owns '" + group[i] + "' but did not load it");
        const HeldByOtherRank& h = held_by_others.at(group[i]);
        meta_[group[i]] = {owner[i], h.shape, h.dtype, nullptr};
        continue;
      }
      meta_[group[i]] = {owner[i], t->shape(), t->dtype(), t};
    }
  }
}

void ShardedParams::release_others() {
  for (const auto& [name, m] : meta_)
    if (m.owner != comm_.rank() && m.value) *m.value = Tensor();
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
      FT_CHECK(m.value, "ZeRO-3: '" + name + "' was loaded by its owner only: no checkpoint of it");
      Tensor t = Tensor::empty(m.shape, m.dtype);
      comm_.recv(t.raw(), int64_t(t.nbytes()), m.owner, what);
      *m.value = std::move(t);
    } else if (m.owner == comm_.rank()) {
      comm_.send(m.value->raw(), int64_t(m.value->nbytes()), 0, what);
    }
  }
}

}  // namespace fusetune::dist
