#pragma once
// SGD as torch.optim.SGD (maximize=False, the single-tensor CPU path), per parameter with a
// gradient:
//   d = g + weight_decay * p                       (L2, only when weight_decay != 0)
//   if momentum != 0:
//     buf = d on the first step, else buf = buf * momentum + (1 - dampening) * d
//     d = nesterov ? d + momentum * buf : buf
//   p += -lr * d
// The momentum buffer has the parameter's dtype; there is no state when momentum == 0.
#include <map>
#include <string>

#include "fusetune/optim/optimizer.h"

namespace fusetune {

struct SGDOptions {
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
};

class SGD : public Optimizer {
 public:
  explicit SGD(SGDOptions options = {});  // throws on invalid combinations, like torch

  const char* name() const override { return "SGD"; }
  void step(const std::vector<ParamRef>& params, double lr) override;
  // Entries per parameter (momentum != 0 only): "<param>.momentum_buffer".
  void save_state(NamedTensors& out) const override;
  void load_state(const StateMap& state, const std::vector<ParamRef>& params) override;
  int64_t state_bytes() const override;

  const SGDOptions& options() const { return options_; }

 private:
  SGDOptions options_;
  std::map<std::string, Tensor> momentum_buffer_;
};

}  // namespace fusetune
