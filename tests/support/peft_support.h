#pragma once
// Helpers the PEFT tests share.
#include <random>

#include "fusetune/core/tensor.h"
#include "fusetune/peft/lora.h"

namespace fusetune::testing {

// Adapters as after some training: B no longer zero (seeded, float or double).
inline void perturb_adapters(TensorMap& p, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-0.3, 0.3);
  for (auto& [name, t] : p) {
    if (!peft::is_adapter_param(name)) continue;
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (t.dtype() == DType::F64)
        t.data<double>()[i] += u(rng);
      else
        t.data<float>()[i] += float(u(rng));
    }
  }
}

}  // namespace fusetune::testing
