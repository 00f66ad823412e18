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
// OpenMP-parallel, so results do not depend on the thread count. Rows (dim 0) with an all-zero
// gradient and all-zero moments (an embedding table's untouched rows) are updated lazily, with
// bitwise the dense result (adamw.cpp).
//
// BF16 parameters (with BF16 gradients) are read in fp32, updated in fp32 with the same
// expressions, and written back with stochastic rounding (stochastic_rounding.h; the random
// bits hash (seed, the parameter's step, its name, the element)); their moments are fp32.
// state_dtype BF16 stores both moments as bf16 (half of fp32's memory) for F32 and BF16
// parameters (not F64: those are for gradient checks): computed in fp32 and written back with
// stochastic rounding too, because exp_avg_sq moves by (1 - beta2) = 0.1% of itself per step at
// the default beta2, below bf16's half-ulp (0.2% to 0.4%): round-to-nearest would freeze it (a
// gradient spike would never decay out of it), while stochastic rounding keeps it unbiased.
#include <map>
#include <string>
#include <vector>

#include "fusetune/optim/optimizer.h"

namespace fusetune {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;      // torch.optim.AdamW's default
  DType state_dtype = DType::F32;  // F32 (the parameter's dtype for F64) or BF16 moments
  uint64_t seed = 0;               // stochastic rounding of bf16 values (config `seed`)
};

class AdamW : public Optimizer {
 public:
  explicit AdamW(AdamWOptions options = {});  // throws on out-of-range hyperparameters

  const char* name() const override { return "AdamW"; }
  void step(const std::vector<ParamRef>& params, double lr) override;
  // Entries per parameter: "<param>.exp_avg", "<param>.exp_avg_sq" (moment_dtype(), the
  // parameter's shape) and "<param>.step" (I64, shape [1]). load_state refuses moments of
  // another dtype (a state saved with another state_dtype) naming optimizer.state_dtype.
  void save_state(NamedTensors& out) const override;
  void load_state(const StateMap& state, const std::vector<ParamRef>& params) override;
  int64_t state_bytes() const override;

  const AdamWOptions& options() const { return options_; }
  int64_t step_count(const std::string& param) const;  // 0 before the parameter's first step
  // The moments' dtype for a parameter of dtype `param`: BF16 with state_dtype BF16, else F64
  // for F64 parameters and F32 otherwise. Throws for F64 parameters with BF16 state.
  DType moment_dtype(DType param) const;

 private:
  struct State {
    Tensor exp_avg, exp_avg_sq;
    int64_t step = 0;
    // Per row (dim 0): may its moments be non-zero? Clear rows with an all-zero gradient get
    // the dense update's result without reading their moments (adamw.cpp, lazy rows).
    std::vector<uint8_t> active_rows;
  };
  AdamWOptions options_;
  std::map<std::string, State> state_;
};

}  // namespace fusetune
