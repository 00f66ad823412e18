#pragma once
// ZeRO-2: gradients sharded too. After each micro-batch's backward, every gradient is summed
// over the ranks into the rank that owns its parameter (the ZeRO-1 partition,
// sharded_optimizer.h; a reduce per tensor, in name order) and the other ranks drop theirs: the
// accumulation buffers and the optimizer step hold the owned gradients only. (The backward
// itself still produces every gradient on every rank: reducing each as the backward produces
// it is not done yet.) The global norm for clipping adds the owners' per-parameter sums
// of squares in name order, so it is bitwise grad_norm over all the summed gradients.
#include <map>
#include <string>
#include <vector>

#include "fusetune/dist/communicator.h"
#include "fusetune/optim/param_ref.h"
#include "fusetune/runtime/tensor.h"

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
  // The L2 norm of all the summed gradients; `refs` are every trainable parameter in name order
  // (those of other ranks without gradients here).
  double global_norm(const std::vector<ParamRef>& refs, const std::string& what);

 private:
  Communicator& comm_;
  std::map<std::string, int> owner_;
};

}  // namespace fusetune::dist
