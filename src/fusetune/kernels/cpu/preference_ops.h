#pragma once
// Small kernels of the preference losses (losses/preference.h): the label log-probabilities
// picked out of a log_softmax, row sums, and the two scalar functions the losses use. Raw
// pointers, like kernels.h; instantiated for float and double.
#include <cstdint>

namespace fusetune::kernels {

// out[i] = logp[i, labels[i]], or 0 where labels[i] == -100. logp [N, V]. A label outside
// [0, V) throws, naming the row.
template <class T>
void label_log_probs(const T* logp, const int32_t* labels, T* out, int64_t N, int64_t V);

// The VJP: dx [N, V] zero except dx[i, labels[i]] = dy[i] (rows with -100 stay zero).
template <class T>
void label_log_probs_backward(const T* dy, const int32_t* labels, T* dx, int64_t N, int64_t V);

// out[r] = sum_j x[r, j] for a row-major [rows, cols] matrix (accumulated in double).
template <class T>
void row_sum(const T* x, T* out, int64_t rows, int64_t cols);

// log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|)): finite for every finite x.
template <class T>
void log_sigmoid(const T* x, T* out, int64_t n);
// dx = dy * sigmoid(-x)
template <class T>
void log_sigmoid_backward(const T* x, const T* dy, T* dx, int64_t n);

// log(1 - exp(x)), accurate on both sides of -log 2 (Maechler 2012): log(-expm1(x)) near 0,
// log1p(-exp(x)) below. -inf at x = 0, NaN above (no probability exceeds 1).
template <class T>
void log1mexp(const T* x, T* out, int64_t n);
// dx = dy * d/dx log(1 - exp(x)) = -dy / expm1(-x)
template <class T>
void log1mexp_backward(const T* x, const T* dy, T* dx, int64_t n);

// 1 / (1 + exp(-x)), from whichever side keeps exp() from overflowing.
template <class T>
void sigmoid(const T* x, T* out, int64_t n);
// dx = dy * y * (1 - y), y = sigmoid(x) as the forward wrote it
template <class T>
void sigmoid_backward(const T* y, const T* dy, T* dx, int64_t n);

template <class T>
void relu(const T* x, T* out, int64_t n);
// dx = x > 0 ? dy : 0
template <class T>
void relu_backward(const T* x, const T* dy, T* dx, int64_t n);

// out = e^x (GRPO's ratio and KL estimator, losses/grpo.h)
template <class T>
void exp_elementwise(const T* x, T* out, int64_t n);

}  // namespace fusetune::kernels
