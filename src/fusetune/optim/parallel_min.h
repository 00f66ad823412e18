#pragma once
// The optimizers' element loops run on the OpenMP pool from this many elements on; below it,
// waking the threads costs more than the loop.
#include <cstdint>

namespace fusetune {

inline constexpr int64_t kOptimizerParallelMin = 1 << 15;

}  // namespace fusetune
