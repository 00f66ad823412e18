#pragma once
// Helpers for the CPU kernel tests: random data, thread-count scoping, bitwise comparison and
// a central finite-difference check of a backward kernel against its forward kernel.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

namespace fusetune::testing {

template <class T = double>
std::vector<T> random_vec(int64_t n, uint32_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<T>(dist(rng));
  return v;
}

template <class T>
std::vector<double> to_double(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// Runs fn with the OpenMP thread count set to n, then restores it.
template <class F>
void with_threads(int n, F fn) {
  const int before = omp_get_max_threads();
  omp_set_num_threads(n);
  fn();
  omp_set_num_threads(before);
}

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// max |a - b| / (atol + rtol * |b|) <= 1, reported element by element on failure.
template <class A, class B>
void expect_close(const std::vector<A>& got, const std::vector<B>& want, double rtol, double atol,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int failures = 0;
  for (size_t i = 0; i < got.size() && failures < 5; ++i) {
    const double g = static_cast<double>(got[i]), w = static_cast<double>(want[i]);
    if (std::isinf(w) && g == w) continue;
    if (!(std::fabs(g - w) <= atol + rtol * std::fabs(w))) {
      ADD_FAILURE() << what << "[" << i << "]: got " << g << ", want " << w;
      ++failures;
    }
  }
}

// Checks a VJP: with L(x) = <dy, f(x)> for a random dy, dL/dx_k by central differences must
// match backward(x, dy)[k]. Double precision throughout.
inline void expect_vjp_matches_fd(
    const std::vector<double>& x, int64_t out_size,
    const std::function<std::vector<double>(const std::vector<double>&)>& forward,
    const std::function<std::vector<double>(const std::vector<double>&,
                                            const std::vector<double>&)>& backward,
    const char* what, double h = 1e-6, double tol = 1e-7) {
  const std::vector<double> dy = random_vec(out_size, 1234);
  auto loss = [&](const std::vector<double>& xs) {
    const std::vector<double> y = forward(xs);
    double s = 0.0;
    for (size_t i = 0; i < y.size(); ++i) s += dy[i] * y[i];
    return s;
  };
  const std::vector<double> dx = backward(x, dy);
  ASSERT_EQ(dx.size(), x.size()) << what;
  std::vector<double> xp = x;
  int failures = 0;
  for (size_t k = 0; k < x.size() && failures < 5; ++k) {
    xp[k] = x[k] + h;
    const double lp = loss(xp);
    xp[k] = x[k] - h;
    const double lm = loss(xp);
    xp[k] = x[k];
    const double fd = (lp - lm) / (2 * h);
    if (!(std::fabs(fd - dx[k]) <= tol * (1.0 + std::fabs(fd)))) {
      ADD_FAILURE() << what << ": d/dx[" << k << "] analytic " << dx[k] << " vs finite diff " << fd;
      ++failures;
    }
  }
}

}  // namespace fusetune::testing
