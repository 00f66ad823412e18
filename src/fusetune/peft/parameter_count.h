#pragma once
// How many parameters a model has, whatever their storage: float tensors by their element
// count, QLoRA's NF4 base weights (peft/nf4_weight.h) by the element count of the matrix they
// encode (not of their packed code tensors). The run header, `fusetune plan` and the
// benchmarks count this way, so a 1.24B-parameter QLoRA model is announced as 1.24B.
#include <cstdint>
#include <functional>
#include <string>

#include "fusetune/peft/nf4_weight.h"
#include "fusetune/runtime/executor.h"

namespace fusetune::peft {

struct ParameterCount {
  int64_t total = 0;
  int64_t trainable = 0;
};

// The logical element count of every weight in the store (NF4 weights are frozen).
int64_t nf4_numel(const NF4Store& store);

// `params` (trainable where `trainable` says so) plus the NF4 weights of `nf4`, if any.
ParameterCount count_parameters(const TensorMap& params,
                                const std::function<bool(const std::string&)>& trainable,
                                const NF4Store* nf4 = nullptr);

}  // namespace fusetune::peft
