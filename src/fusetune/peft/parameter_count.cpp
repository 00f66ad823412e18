#include "fusetune/peft/parameter_count.h"

namespace fusetune::peft {

int64_t nf4_numel(const NF4Store& store) {
  int64_t n = 0;
  for (const auto& [name, w] : store) {
    int64_t numel = 1;
    for (int64_t d : w.shape) numel *= d;
    n += numel;
  }
  return n;
}

ParameterCount count_parameters(const TensorMap& params,
                                const std::function<bool(const std::string&)>& trainable,
                                const NF4Store* nf4) {
  ParameterCount c;
  for (const auto& [name, t] : params) {
    c.total += t.numel();
    if (trainable && trainable(name)) c.trainable += t.numel();
  }
  if (nf4) c.total += nf4_numel(*nf4);
  return c;
}

}  // namespace fusetune::peft
