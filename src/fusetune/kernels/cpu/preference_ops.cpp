#include "fusetune/kernels/cpu/preference_ops.h"

#include <cmath>
#include <cstring>
#include <string>

#include "fusetune/util/error.h"

namespace fusetune::kernels {
namespace {

void check_label(int32_t y, int64_t row, int64_t V) {
  FT_CHECK(y >= 0 && y < V, "label " + std::to_string(y) + " at token " + std::to_string(row) +
                                " is outside the vocabulary [0, " + std::to_string(V) + ")");
}

}  // namespace

template <class T>
void label_log_probs(const T* logp, const int32_t* labels, T* out, int64_t N, int64_t V) {
  for (int64_t i = 0; i < N; ++i) {
    if (labels[i] == -100) {
      out[i] = T(0);
      continue;
    }
    check_label(labels[i], i, V);
    out[i] = logp[i * V + labels[i]];
  }
}

template <class T>
void label_log_probs_backward(const T* dy, const int32_t* labels, T* dx, int64_t N, int64_t V) {
  std::memset(dx, 0, sizeof(T) * size_t(N * V));
  for (int64_t i = 0; i < N; ++i) {
    if (labels[i] == -100) continue;
    check_label(labels[i], i, V);
    dx[i * V + labels[i]] = dy[i];
  }
}

template <class T>
void row_sum(const T* x, T* out, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols >= (1 << 16))
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0;
    for (int64_t j = 0; j < cols; ++j) s += double(x[r * cols + j]);
    out[r] = T(s);
  }
}

// 1 / (1 + exp(-x)), from whichever side keeps exp() from overflowing: LogSigmoid's gradient
// (at -x) and Sigmoid.
template <class T>
T sigmoid_no_overflow(T x) {
  const T e = std::exp(-std::abs(x));
  return x >= 0 ? T(1) / (T(1) + e) : e / (T(1) + e);
}

template <class T>
void log_sigmoid(const T* x, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    out[i] = std::min(x[i], T(0)) - std::log1p(std::exp(-std::abs(x[i])));
}

template <class T>
void log_sigmoid_backward(const T* x, const T* dy, T* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * sigmoid_no_overflow(-x[i]);
}

template <class T>
void log1mexp(const T* x, T* out, int64_t n) {
  const T ln2 = T(0.693147180559945309417232121458176568);
  for (int64_t i = 0; i < n; ++i)
    out[i] = x[i] > -ln2 ? std::log(-std::expm1(x[i])) : std::log1p(-std::exp(x[i]));
}

template <class T>
void log1mexp_backward(const T* x, const T* dy, T* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = -dy[i] / std::expm1(-x[i]);
}

template <class T>
void sigmoid(const T* x, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = sigmoid_no_overflow(x[i]);
}

template <class T>
void sigmoid_backward(const T* y, const T* dy, T* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * y[i] * (T(1) - y[i]);
}

template <class T>
void relu(const T* x, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] > T(0) ? x[i] : T(0);
}

template <class T>
void relu_backward(const T* x, const T* dy, T* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = x[i] > T(0) ? dy[i] : T(0);
}

template <class T>
void exp_elementwise(const T* x, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = std::exp(x[i]);
}

#define FT_PREF_OPS(T)                                                                       \
  template void label_log_probs<T>(const T*, const int32_t*, T*, int64_t, int64_t);          \
  template void label_log_probs_backward<T>(const T*, const int32_t*, T*, int64_t, int64_t); \
  template void row_sum<T>(const T*, T*, int64_t, int64_t);                                  \
  template void log_sigmoid<T>(const T*, T*, int64_t);                                       \
  template void log_sigmoid_backward<T>(const T*, const T*, T*, int64_t);                    \
  template void log1mexp<T>(const T*, T*, int64_t);                                          \
  template void log1mexp_backward<T>(const T*, const T*, T*, int64_t);                       \
  template void sigmoid<T>(const T*, T*, int64_t);                                           \
  template void sigmoid_backward<T>(const T*, const T*, T*, int64_t);                        \
  template void relu<T>(const T*, T*, int64_t);                                              \
  template void relu_backward<T>(const T*, const T*, T*, int64_t);                           \
  template void exp_elementwise<T>(const T*, T*, int64_t);
FT_PREF_OPS(float)
FT_PREF_OPS(double)
#undef FT_PREF_OPS

}  // namespace fusetune::kernels
