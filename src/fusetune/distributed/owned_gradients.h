#pragma once
// ZeRO-2: gradients sharded too. Every gradient is summed over the ranks into the rank that
// owns its parameter (the ZeRO-1 partition, sharded_optimizer.h; a reduce per tensor) and the
// other ranks drop theirs: the accumulation buffers and the optimizer step hold the owned
// gradients only.
//
// When the step hands its gradients over as the backward computes them (training_step.h), each
// is reduced right then, so a rank never holds the gradients other ranks own: the backward's
// peak falls too. The ranks' collectives must come in one order: rank 0's handover order,
// broadcast once (set_order). A gradient a rank's backward hands over before its turn in that
// order is held until its turn comes (the same graph on every rank hands them over in the same
// order, so nothing is held). Steps that cannot stream (DPO) reduce after each micro-batch's
// backward, in name order (reduce()).
//
// The global norm for clipping adds the owners' per-parameter sums of squares in name order,
// so it is bitwise grad_norm over all the summed gradients.
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "fusetune/core/tensor.h"
#include "fusetune/distributed/communicator.h"
#include "fusetune/optim/param_ref.h"

namespace fusetune::dist {

class OwnedGradients {
 public:
  // `names` in name order with their element counts: the same on every rank.
  OwnedGradients(Communicator& comm, const std::vector<std::string>& names,
                 const std::vector<int64_t>& numels);
  bool mine(const std::string& name) const { return owner_.at(name) == comm_.rank(); }
  // Sums `grad` (fp32) over the ranks into its owner; true when this rank owns it (and keeps
  // the sum), false when it should drop it. Unknown names (frozen parameters): false.
  bool reduce(const std::string& name, Tensor& grad, const std::string& what);
  // Reducing during the backward: `order` is the names in rank 0's handover order (the same
  // list on every rank).
  void set_order(std::vector<std::string> order);
  bool has_order() const { return !order_.empty(); }
  // A gradient the backward handed over: it and any held ones whose turn follows are reduced;
  // `keep` receives each sum this rank owns. Unknown names (frozen parameters) are ignored.
  using Keep = std::function<void(const std::string& name, Tensor sum)>;
  void hand_over(const std::string& name, Tensor grad, const Keep& keep, const std::string& what);
  // After each micro-batch's run: every gradient of the order was reduced (else an error naming
  // the first missing one); the next run starts again at the order's beginning.
  void end_of_backward();
  // The L2 norm of all the summed gradients; `refs` are every trainable parameter in name order
  // (those of other ranks without gradients here).
  double global_norm(const std::vector<ParamRef>& refs, const std::string& what);

 private:
  Communicator& comm_;
  std::map<std::string, int> owner_;
  std::vector<std::string> order_;
  size_t next_ = 0;                     // the turn: order_[next_] is reduced next
  std::map<std::string, Tensor> held_;  // handed over before their turn
};

}  // namespace fusetune::dist
