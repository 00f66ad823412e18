#pragma once
// Where a parameter goes as it is produced (random init, checkpoint load), one at a time. By
// default a parameter becomes a tensor in the run's dtype; a sink can take some parameters
// instead and store them in its own form (QLoRA quantizes its frozen base to NF4:
// peft::NF4BaseSink), so that no float copy of the whole model ever exists.
#include <cstdint>
#include <functional>
#include <string>

#include "fusetune/core/tensor.h"

namespace fusetune {

class ParamSink {
 public:
  virtual ~ParamSink() = default;
  // Whether the sink stores `name` itself; asked before the parameter's values are produced.
  virtual bool takes(const std::string& name) const = 0;
  // Writes elements [first, first + n) of a parameter (row-major) as F32 into `out`: the
  // checkpoint's bytes widened, or the random init. `first` is even. Safe to call from
  // several threads at once for disjoint ranges (a sink may produce chunks in parallel).
  using ElementSource = std::function<void(int64_t first, int64_t n, float* out)>;
  // A taken parameter, produced a range of elements at a time as the sink asks, so that it
  // never exists whole in F32 (an 8B model's head is 2.1 GB in F32). `values` is valid only
  // during the call. Called once per taken name, in no particular order, never concurrently.
  virtual void put(const std::string& name, const Shape& shape, const ElementSource& values) = 0;
};

}  // namespace fusetune
