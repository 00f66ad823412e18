#pragma once
// Index arithmetic the kernels of several op families share.
#include <cstdint>

#include "fusetune/core/tensor.h"

namespace fusetune::ops {

// The product of dims [from, to) of `s`: a layout's outer, middle or inner extent.
inline int64_t prod(const Shape& s, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to; ++i) p *= s[i];
  return p;
}

}  // namespace fusetune::ops
