#pragma once
// Where a parameter goes as it is produced (random init, checkpoint load), one at a time. By
// default a parameter becomes a tensor in the run's dtype; a sink can take some parameters
// instead and store them in its own form (QLoRA quantizes its frozen base to NF4:
// peft::NF4BaseSink), so that no float copy of the whole model ever exists.
#include <string>

#include "fusetune/runtime/tensor.h"

namespace fusetune {

class ParamSink {
 public:
  virtual ~ParamSink() = default;
  // Whether the sink stores `name` itself; asked before the parameter's values are produced.
  virtual bool takes(const std::string& name) const = 0;
  // A taken parameter's values, always F32 (converted from the checkpoint's bytes, or the
  // random init rounded to F32), valid only during the call. Called once per taken name, in
  // no particular order, never concurrently.
  virtual void put(const std::string& name, const Tensor& value) = 0;
};

}  // namespace fusetune
