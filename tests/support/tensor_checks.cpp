#include "tensor_checks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>

namespace fusetune::testing {
namespace {

bool same_shape(const Tensor& a, const Tensor& b, const char* what) {
  if (a.shape() == b.shape() && a.numel() == b.numel()) return true;
  ADD_FAILURE() << what << ": shapes differ: " << shape_str(a.shape()) << " vs "
                << shape_str(b.shape());
  return false;
}

}  // namespace

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  if (!same_shape(a, b, "max_abs_diff")) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    worst = std::max(worst, std::abs(element_as_double(a, i) - element_as_double(b, i)));
  return worst;
}

double max_rel_diff(const Tensor& a, const Tensor& b) {
  if (!same_shape(a, b, "max_rel_diff")) return std::numeric_limits<double>::infinity();
  double scale = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    scale = std::max(scale, std::abs(element_as_double(a, i)));
  return max_abs_diff(a, b) / std::max(scale, 1e-12);
}

Tensor random_tensor(const Shape& s, DType dt, uint64_t seed, double lo, double hi) {
  if (!(lo < hi))
    throw std::invalid_argument("random_tensor: lo " + std::to_string(lo) + " >= hi " +
                                std::to_string(hi));
  if (dt != DType::F32 && dt != DType::F64)
    throw std::invalid_argument(std::string("random_tensor: ") + dtype_name(dt) +
                                " is not F32 or F64");
  Tensor t = Tensor::empty(s, dt);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dt == DType::F64)
      t.data<double>()[i] = u(rng);
    else
      t.data<float>()[i] = float(u(rng));
  }
  return t;
}

}  // namespace fusetune::testing
