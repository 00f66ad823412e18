#pragma once
// AdamW with exactly torch.optim.AdamW's update (amsgrad=False, maximize=False, the
// single-tensor CPU path), per parameter with a gradient:
//   step += 1
//   p *= 1 - lr * weight_decay                       (decoupled weight decay, first)
//   m  = lerp(m, g, 1 - beta1)                       (exp_avg)
//   v  = v * beta2 + (1 - beta2) * g * g             (exp_avg_sq)
//   denom = sqrt(v) / sqrt(1 - beta2^step) + eps
//   p += -(lr / (1 - beta1^step)) * m / denom
// Scalars are computed in double, as Python does, and applied in the parameter's dtype;
// moments have the parameter's dtype (fp32 for F32 params, double for F64). Elementwise and
// OpenMP-parallel, so results do not depend on the thread count.
#include <map>
#include <string>

#include "fusetune/optim/optimizer.h"

namespace fusetune {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;  // torch.optim.AdamW's default
};

class AdamW : public Optimizer {
 public:
  explicit AdamW(AdamWOptions options = {});  // throws on out-of-range hyperparameters

  const char* name() const override { return "AdamW"; }
  void step(const std::vector<ParamRef>& params, double lr) override;
  // Entries per parameter: "<param>.exp_avg", "<param>.exp_avg_sq" (the parameter's dtype
  // and shape) and "<param>.step" (I64, shape [1]).
  void save_state(NamedTensors& out) const override;
  void load_state(const StateMap& state, const std::vector<ParamRef>& params) override;
  int64_t state_bytes() const override;

  const AdamWOptions& options() const { return options_; }
  int64_t step_count(const std::string& param) const;  // 0 before the parameter's first step

 private:
  struct State {
    Tensor exp_avg, exp_avg_sq;
    int64_t step = 0;
  };
  AdamWOptions options_;
  std::map<std::string, State> state_;
};

}  // namespace fusetune
