#pragma once
// Helpers the compile-pass tests share: how far a tensor is from a reference, how many nodes of
// an op a graph holds, and seeded random inputs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include <gtest/gtest.h>

#include "fusetune/graph/graph.h"
#include "fusetune/runtime/tensor.h"

namespace fusetune::testing {

// Largest |a - b| over the largest |a|: a relative error that does not blow up on zeros.
// Tensors of different shapes (or element counts) are a test failure and compare as +inf,
// so a shape bug can never pass as a small difference over a common prefix.
inline double max_rel_diff(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.numel() != b.numel()) {
    ADD_FAILURE() << "max_rel_diff: shapes differ: " << shape_str(a.shape()) << " vs "
                  << shape_str(b.shape());
    return std::numeric_limits<double>::infinity();
  }
  double worst = 0, scale = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    scale = std::max(scale, std::abs(element_as_double(a, i)));
  for (int64_t i = 0; i < a.numel(); ++i)
    worst = std::max(worst, std::abs(element_as_double(a, i) - element_as_double(b, i)) /
                                std::max(scale, 1e-12));
  return worst;
}

inline int count_ops(const Graph& g, Op op) {
  int n = 0;
  for (const Node& node : g.nodes()) n += node.op == op;
  return n;
}

// Uniform in [-range, range), float or double.
inline Tensor random_tensor(const Shape& s, DType dt, uint64_t seed, double range = 1.0) {
  Tensor t = Tensor::empty(s, dt);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-range, range);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dt == DType::F64)
      t.data<double>()[i] = u(rng);
    else
      t.data<float>()[i] = float(u(rng));
  }
  return t;
}

}  // namespace fusetune::testing
