#pragma once
// ZeRO-1: the optimizer state sharded over the ranks. The trainable parameters, in name order
// (the order of the flat gradient buffers), are cut into `size()` consecutive ranges of about
// equal element counts; each rank keeps optimizer state for, and updates, only the parameters
// of its range (whole tensors, so any optimizer works unchanged), then every parameter is
// broadcast from the rank that updated it (large ones in place, small ones packed in buckets).
// Gradients are still summed on every rank (ZeRO-0's all-reduce), so clipping sees the global norm
// as before.
//
// Checkpoints stay rank-independent: before a save every rank sends its state to rank 0
// (gather_state, dropped after the save), whose save_state then lists the whole state under the
// single-process names; load_state keeps the entries of this rank's parameters, so a run resumes
// with any number of ranks.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fusetune/distributed/communicator.h"
#include "fusetune/optim/optimizer.h"

namespace fusetune::dist {

// The rank that owns each of `numels` (parameters in name order): consecutive ranges, balanced
// by element count.
std::vector<int> partition_by_elements(const std::vector<int64_t>& numels, int ranks);

// After the update every parameter is broadcast from its owner: one at least this large in
// place, smaller ones packed into a staging bucket of at most this size (16 MiB).
inline constexpr int64_t kBroadcastBucketBytes = int64_t(16) << 20;

// The bytes of that staging bucket (counted memory) for parameters of `nbytes`: their small
// ones' total up to one bucket; 0 with one rank.
int64_t broadcast_buffer_bytes(const std::vector<int64_t>& nbytes, int ranks);

class ShardedOptimizer : public Optimizer {
 public:
  // `names`: every trainable parameter in name order, `numels` their element counts (the
  // partition is fixed here, so ZeRO-3 may free the parameters other ranks own). With
  // `broadcast_updates` false (ZeRO-3: nobody else holds them) updated parameters stay where
  // they are.
  ShardedOptimizer(std::unique_ptr<Optimizer> inner, Communicator& comm,
                   const std::vector<std::string>& names, const std::vector<int64_t>& numels,
                   bool broadcast_updates = true);

  const char* name() const override { return inner_->name(); }
  // Every rank passes every parameter (the same list): updates its own, then broadcasts.
  void step(const std::vector<ParamRef>& params, double lr) override;
  // Rank 0 after gather_state: the whole state; otherwise this rank's part.
  void save_state(NamedTensors& out) const override;
  void load_state(const StateMap& state, const std::vector<ParamRef>& params) override;
  int64_t state_bytes() const override { return inner_->state_bytes(); }

  // Collective, before a checkpoint: ranks > 0 send their state to rank 0.
  void gather_state(const std::string& what);
  // After the checkpoint is written: frees what gather_state received.
  void drop_gathered_state() { gathered_.clear(); }

 private:
  std::vector<ParamRef> owned(const std::vector<ParamRef>& params);

  int owner(const ParamRef& p) const;

  std::unique_ptr<Optimizer> inner_;
  Communicator& comm_;
  std::map<std::string, int> owner_;
  bool broadcast_updates_ = true;
  NamedTensors gathered_;  // rank 0: the other ranks' state, from gather_state
};

}  // namespace fusetune::dist
