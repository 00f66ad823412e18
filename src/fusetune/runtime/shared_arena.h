#pragma once
// The arena buffer compiled steps place their intermediates in, shared by every compiled
// graph of a run (one per batch shape; a DPO step's policy and reference graphs): only one
// step runs at a time, so one buffer as large as the largest plan serves them all, and a
// run's peak is its largest step's whatever the sequence of shapes (issue: one arena per
// shape made the peak grow with every new padded length).
#include <cstdint>

#include "fusetune/core/tensor.h"

namespace fusetune {

class SharedArena {
 public:
  // A buffer of at least `bytes` (counted memory). Growing frees the old buffer before
  // allocating the new one, so pointers from an earlier call are invalid after a call that
  // grew it: call it at the start of a run, never during one.
  char* reserve(int64_t bytes) {
    if (bytes > capacity_) {
      buffer_ = Tensor();
      buffer_ = Tensor::empty({(bytes + 3) / 4}, DType::F32);
      capacity_ = bytes;
    }
    return static_cast<char*>(buffer_.raw());
  }
  int64_t capacity() const { return capacity_; }

 private:
  Tensor buffer_;
  int64_t capacity_ = -1;
};

}  // namespace fusetune
