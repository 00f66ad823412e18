#pragma once
// Tensor comparisons and seeded random tensors the tests share.
#include <cstdint>

#include "fusetune/core/tensor.h"

namespace fusetune::testing {

// Bitwise equality: the same dtype, the same shape and the same bytes.
bool same_bits(const Tensor& a, const Tensor& b);

// Largest |a - b| (elements read as doubles). Tensors of different shapes are a test failure
// (ADD_FAILURE) and compare as +inf, so a shape bug never passes as a small difference over a
// common prefix.
double max_abs_diff(const Tensor& a, const Tensor& b);

// Largest |a - b| over the largest |a| (at least 1e-12): a relative error that does not blow
// up on zeros. Different shapes: a test failure and +inf, as max_abs_diff.
double max_rel_diff(const Tensor& a, const Tensor& b);

// F32 or F64 values uniform in [lo, hi) (lo < hi), drawn in element order from
// std::mt19937_64(seed) through std::uniform_real_distribution<double>.
Tensor random_tensor(const Shape& s, DType dt, uint64_t seed, double lo = -1.0, double hi = 1.0);

}  // namespace fusetune::testing
