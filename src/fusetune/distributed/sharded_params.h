#pragma once
// ZeRO-3: the parameters sharded over the ranks too (the FSDP analog). Each parameter lives
// whole on one rank: a trainable one on the rank that updates it (the ZeRO-1 partition of
// sharded_optimizer.h), a frozen one (a LoRA base weight) by the same partition of the frozen
// parameters; the other ranks hold nothing for it. The step graphs are compiled with
// params_at_use (compile/params_at_use.h) and bind their parameters through source(): each one
// is broadcast from its owner right before its first use in the forward, dropped after, and
// broadcast again for the backward. The copies land in reused buffers (gather_pool.h).
//
// Frozen tensors a job keeps outside the parameter map (QLoRA's NF4 base: packed codes and
// scales, peft/nf4_weight.h) are sharded the same way, partitioned with the frozen parameters
// and broadcast in their stored (packed) form.
//
// The optimizer then updates the owned parameters in place and broadcasts nothing; a
// checkpoint gathers every parameter to rank 0, one at a time, and rank 0 frees the others'
// again once it is written.
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "fusetune/distributed/communicator.h"
#include "fusetune/distributed/gather_pool.h"
#include "fusetune/runtime/executor.h"

namespace fusetune::dist {

// A frozen parameter this rank never loaded because another rank owns it (a ZeRO-3 KD
// teacher loads only its share): its shape and dtype, for the partition and the gathers.
struct HeldByOtherRank {
  Shape shape;
  DType dtype = DType::F32;
};

class ShardedParams {
 public:
  // `params`: every parameter, whole, on every rank (as loaded); `trainable`: the trained ones;
  // `frozen_elsewhere`: more frozen tensors by the names the graphs bind them as (each pointer
  // outlives this object), whole on every rank too; `held_by_others`: frozen parameters this
  // rank did not load (the partition must give each one to another rank: checked).
  ShardedParams(Communicator& comm, TensorMap& params, const std::vector<std::string>& trainable,
                const std::map<std::string, Tensor*>& frozen_elsewhere = {},
                const std::map<std::string, HeldByOtherRank>& held_by_others = {});
  bool mine(const std::string& name) const { return meta_.at(name).owner == comm_.rank(); }
  // Frees this rank's values of the parameters other ranks own (their entries stay, undefined).
  void release_others();
  // Collective (every rank, the same names in the same order): the parameter's value, the
  // owner's own tensor there and a copy in a pooled buffer elsewhere.
  Tensor acquire(const std::string& name);
  ParamSource source() {
    return ParamSource([this](const std::string& name) { return acquire(name); });
  }
  // Gather buffers allocated since the last call (0 once the pool has every one the step needs).
  int64_t take_new_gather_buffers() { return pool_.take_new_buffers(); }
  // Collective, before a checkpoint: rank 0 receives every parameter it does not own (those
  // `needed` accepts, when given), in name order; the other ranks send theirs. Rank 0 holds
  // them until release_others(). The pool's idle buffers are freed first.
  void gather_to_rank0(const std::string& what,
                       const std::function<bool(const std::string&)>& needed = nullptr);

 private:
  struct Meta {
    int owner = 0;
    Shape shape;
    DType dtype = DType::F32;
    Tensor* value = nullptr;  // this rank's tensor: an entry of the parameter map, or elsewhere
  };
  Communicator& comm_;
  std::map<std::string, Meta> meta_;  // name order: the same on every rank
  GatherPool pool_;
};

}  // namespace fusetune::dist
