#pragma once
// SGD as torch.optim.SGD (maximize=False, the single-tensor CPU path), per parameter with a
// gradient:
//   d = g + weight_decay * p                       (L2, only when weight_decay != 0)
//   if momentum != 0:
//     buf = d on the first step, else buf = buf * momentum + (1 - dampening) * d
//     d = nesterov ? d + momentum * buf : buf
//   p += -lr * d
// The momentum buffer has the parameter's dtype; there is no state when momentum == 0.
//
// BF16 parameters (BF16 gradients) are computed in fp32 and written back with stochastic
// rounding (stochastic_rounding.h); state_dtype BF16 stores the momentum buffer as bf16, also
// stochastically rounded (F32 and BF16 parameters only). The random bits hash a per-parameter
// step count, so whenever something is stored in bf16 the state also holds "<param>.step"
// (even with momentum == 0), and a resumed run draws the same bits as an uninterrupted one.
// Plain F32/F64 training keeps exactly the state and arithmetic described above.
#include <map>
#include <string>

#include "fusetune/optim/optimizer.h"

namespace fusetune {

struct SGDOptions {
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
  DType state_dtype = DType::F32;  // the momentum buffer: F32 (F64 for F64 params) or BF16
  uint64_t seed = 0;               // stochastic rounding of bf16 values (config `seed`)
};

class SGD : public Optimizer {
 public:
  explicit SGD(SGDOptions options = {});  // throws on invalid combinations, like torch

  const char* name() const override { return "SGD"; }
  void step(const std::vector<ParamRef>& params, double lr) override;
  // Entries per parameter (momentum != 0 only): "<param>.momentum_buffer" (buffer_dtype());
  // plus "<param>.step" (I64 [1]) when uses_rounding().
  void save_state(NamedTensors& out) const override;
  void load_state(const StateMap& state, const std::vector<ParamRef>& params) override;
  int64_t state_bytes() const override;

  const SGDOptions& options() const { return options_; }
  // The momentum buffer's dtype for a parameter of dtype `param` (throws: F64 with BF16 state).
  DType buffer_dtype(DType param) const;
  // Whether a parameter of dtype `param` stores anything in bf16 (and so counts its steps).
  bool uses_rounding(DType param) const;

 private:
  SGDOptions options_;
  std::map<std::string, Tensor> momentum_buffer_;
  std::map<std::string, int64_t> steps_;  // parameters that use_rounding only
};

}  // namespace fusetune
