// Row-wise divergences for knowledge distillation (divergence.h). Every row is independent:
// rows run in parallel, each summed in the same order whatever the thread count (float rows:
// vectorized float terms in blocks, the blocks in double; double rows: in double), and the row
// values are added in row order, so results are bitwise reproducible.
#include "fusetune/kernels/cpu/divergence.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "fusetune/kernels/cpu/row_softmax.h"
#include "fusetune/kernels/cpu/vexp.h"
#include "fusetune/kernels/cpu/vlog.h"
#include "fusetune/util/error.h"

namespace fusetune::kernels {
namespace {

constexpr int32_t kDivergenceIgnore = -100;

// log-sum-exp of x[0..V) / T, in double.
template <class T>
double scaled_lse(const T* x, int64_t V, double inv_t) {
  double mx = -INFINITY;
  for (int64_t v = 0; v < V; ++v) mx = std::max(mx, double(x[v]) * inv_t);
  double s = 0;
  for (int64_t v = 0; v < V; ++v) s += std::exp(double(x[v]) * inv_t - mx);
  return mx + std::log(s);
}

// log(exp(a) + exp(b)), finite when either is.
double log_add_exp(double a, double b) {
  const double hi = std::max(a, b), lo = std::min(a, b);
  if (hi == -INFINITY) return -INFINITY;
  return hi + std::log1p(std::exp(lo - hi));
}

// x log(x / y) from the logs, 0 where x is 0.
double kl_term(double log_x, double log_y) {
  return log_x == -INFINITY ? 0.0 : std::exp(log_x) * (log_x - log_y);
}

void check_params(const DivergenceParams& p) {
  FT_CHECK(p.temperature > 0,
           "divergence: temperature must be > 0, got " + std::to_string(p.temperature));
  FT_CHECK(p.beta >= 0 && p.beta <= 1,
           "divergence: beta must be in [0, 1], got " + std::to_string(p.beta));
}

// Float rows of the two KL kinds, vectorized: exps by vexp in float lanes, sums in blocks of
// 512 across lanes and the blocks in double (row_softmax.h's scheme; a double accumulator in
// the loop makes it scalar). The double path below took ~7 scalar std::exp per element, most
// of a KD step at a 128K vocabulary. `f(v)` returns the term to sum, writing nothing.
constexpr int64_t kDivBlock = 512;
template <class F>
double blocked_sum(int64_t V, const F& f) {
  double total = 0;
  for (int64_t v0 = 0; v0 < V; v0 += kDivBlock) {
    const int64_t v1 = std::min(V, v0 + kDivBlock);
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int64_t v = v0; v < v1; ++v) s += f(v);
    total += double(s);
  }
  return total;
}

// log-sum-exp of x[0..V) * inv_t.
double scaled_lse_f32(const float* x, int64_t V, float inv_t) {
  const float mx = detail::row_max(x, V) * inv_t;
  return double(mx) +
         std::log(blocked_sum(V, [&](int64_t v) { return detail::vexp(x[v] * inv_t - mx); }));
}

// x (log x - log y) with x = exp(log_x), 0 where x is 0 (log_x = -inf would give NaN).
inline float kl_term_f32(float log_x, float log_y) {
  const float x = detail::vexp(log_x);
  return x > 0.f ? x * (log_x - log_y) : 0.f;
}

// Each kind's row in float: the loss, and with ds its gradient w.r.t. the student's logits.
// ds may alias s or t: each iteration reads its own index before writing it.
struct RowF32 {
  const float *s, *t;
  int64_t V;
  float inv_t, ls, lt;  // 1/T and both log-sum-exps of the scaled logits
  float lq(int64_t v) const { return s[v] * inv_t - ls; }
  float lp(int64_t v) const { return t[v] * inv_t - lt; }
};

// Forward KL: -sum p log q (torchtune), or with `true_kl` sum p (log p - log q); dz = (q - p)/T.
double forward_kl_f32(const RowF32& r, bool true_kl, float* ds, float k) {
  const double loss =
      true_kl ? blocked_sum(r.V, [&](int64_t v) { return kl_term_f32(r.lp(v), r.lq(v)); })
              : blocked_sum(r.V, [&](int64_t v) { return -detail::vexp(r.lp(v)) * r.lq(v); });
  if (ds) {
#pragma omp simd
    for (int64_t v = 0; v < r.V; ++v) ds[v] = k * (detail::vexp(r.lq(v)) - detail::vexp(r.lp(v)));
  }
  return loss;
}

// Reverse KL: sum q (log q - log p); dz = q (log q - log p - loss) / T.
double reverse_kl_f32(const RowF32& r, float* ds, float k) {
  const double loss = blocked_sum(r.V, [&](int64_t v) { return kl_term_f32(r.lq(v), r.lp(v)); });
  if (ds) {
    const float mean = float(loss);
#pragma omp simd
    for (int64_t v = 0; v < r.V; ++v) {
      const float lq = r.lq(v), q = detail::vexp(lq);
      ds[v] = q > 0.f ? k * q * (lq - r.lp(v) - mean) : 0.f;
    }
  }
  return loss;
}

// Generalized JSD, 0 < beta < 1: beta KL(p||m) + (1 - beta) KL(q||m), m = beta p + (1-beta) q;
// g = (1 - beta)(log q - log m), dz = q (g - sum q g) / T.
double jsd_f32(const RowF32& r, float beta, float* ds, float k) {
  const float b1 = 1.f - beta;
  const auto log_m = [&](float lp, float lq) {
    return detail::vlog(beta * detail::vexp(lp) + b1 * detail::vexp(lq));
  };
  const double loss = blocked_sum(r.V, [&](int64_t v) {
    const float lp = r.lp(v), lq = r.lq(v), lm = log_m(lp, lq);
    return beta * kl_term_f32(lp, lm) + b1 * kl_term_f32(lq, lm);
  });
  if (!ds) return loss;
  const float mean = float(blocked_sum(r.V, [&](int64_t v) {
    const float lp = r.lp(v), lq = r.lq(v);
    return b1 * kl_term_f32(lq, log_m(lp, lq));
  }));
#pragma omp simd
  for (int64_t v = 0; v < r.V; ++v) {
    const float lp = r.lp(v), lq = r.lq(v), q = detail::vexp(lq);
    ds[v] = q > 0.f ? k * q * (b1 * (lq - log_m(lp, lq)) - mean) : 0.f;
  }
  return loss;
}

double divergence_row_f32(const float* s, const float* t, int64_t V, DivergenceKind kind,
                          bool true_kl, float beta, float inv_t, float* ds, double grad_scale) {
  const RowF32 r{
      s, t, V, inv_t, float(scaled_lse_f32(s, V, inv_t)), float(scaled_lse_f32(t, V, inv_t))};
  const float k = float(grad_scale) * inv_t;
  switch (kind) {
    case DivergenceKind::ForwardKL:
      return forward_kl_f32(r, true_kl, ds, k);
    case DivergenceKind::ReverseKL:
      return reverse_kl_f32(r, ds, k);
    case DivergenceKind::GeneralizedJSD:
      break;
  }
  return jsd_f32(r, beta, ds, k);
}

}  // namespace

template <class T>
double divergence_row(const T* student, const T* teacher, int64_t V, const DivergenceParams& p,
                      T* ds, double grad_scale) {
  const double inv_t = 1.0 / p.temperature;
  // Each kind's loss, and, per logit, the gradient w.r.t. log q that the softmax turns into
  // the gradient w.r.t. the logits: dz_v = q_v (g_v - sum_u q_u g_u) / T.
  DivergenceKind kind = p.kind;
  if (kind == DivergenceKind::GeneralizedJSD && p.beta == 0) kind = DivergenceKind::ForwardKL;
  if (kind == DivergenceKind::GeneralizedJSD && p.beta == 1) kind = DivergenceKind::ReverseKL;
  const bool true_kl = p.kind == DivergenceKind::GeneralizedJSD;  // beta 0: KL(p||q) itself
  if constexpr (std::is_same_v<T, float>)
    return divergence_row_f32(student, teacher, V, kind, true_kl, float(p.beta), float(inv_t), ds,
                              grad_scale);
  const double lse_s = scaled_lse(student, V, inv_t), lse_t = scaled_lse(teacher, V, inv_t);
  auto log_q = [&](int64_t v) { return double(student[v]) * inv_t - lse_s; };
  auto log_p = [&](int64_t v) { return double(teacher[v]) * inv_t - lse_t; };
  const double lb = std::log(p.beta), l1b = std::log1p(-p.beta);
  auto log_m = [&](int64_t v) { return log_add_exp(lb + log_p(v), l1b + log_q(v)); };
  double loss = 0;
  for (int64_t v = 0; v < V; ++v) {
    switch (kind) {
      case DivergenceKind::ForwardKL:
        loss += true_kl ? kl_term(log_p(v), log_q(v)) : -std::exp(log_p(v)) * log_q(v);
        break;
      case DivergenceKind::ReverseKL:
        loss += kl_term(log_q(v), log_p(v));
        break;
      case DivergenceKind::GeneralizedJSD: {
        const double lm = log_m(v);
        loss += p.beta * kl_term(log_p(v), lm) + (1 - p.beta) * kl_term(log_q(v), lm);
        break;
      }
    }
  }
  if (!ds) return loss;
  const double k = grad_scale * inv_t;
  if (kind == DivergenceKind::ForwardKL) {  // g = -p / q: dz = (q - p) / T
    for (int64_t v = 0; v < V; ++v) ds[v] = T(k * (std::exp(log_q(v)) - std::exp(log_p(v))));
    return loss;
  }
  // Reverse KL: g = log q - log p (+1, which the softmax cancels); its q-weighted mean is the
  // loss. JSD: g = (1 - beta)(log q - log m).
  auto g = [&](int64_t v) {
    return kind == DivergenceKind::ReverseKL ? log_q(v) - log_p(v)
                                             : (1 - p.beta) * (log_q(v) - log_m(v));
  };
  double mean = 0;
  if (kind == DivergenceKind::ReverseKL) {
    mean = loss;
  } else {
    for (int64_t v = 0; v < V; ++v) mean += std::exp(log_q(v)) * g(v);
  }
  // ds may alias student: log_q(v) reads student[v] before ds[v] overwrites it, and the
  // statistics (lse_s, mean) were taken above.
  for (int64_t v = 0; v < V; ++v) {
    const double lq = log_q(v);
    ds[v] = T(k * std::exp(lq) * (g(v) - mean));
  }
  return loss;
}

template <class T>
double divergence_sum(const T* student, const T* teacher, const int32_t* labels, int64_t N,
                      int64_t V, const DivergenceParams& p) {
  check_params(p);
  std::vector<double> rows(size_t(N), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r)
    if (labels[r] != kDivergenceIgnore)
      rows[size_t(r)] = divergence_row(student + r * V, teacher + r * V, V, p);
  double s = 0;
  for (double x : rows) s += x;
  return s;
}

template <class T>
void divergence_backward(T dloss, const T* student, const T* teacher, const int32_t* labels,
                         T* dstudent, int64_t N, int64_t V, const DivergenceParams& p) {
  check_params(p);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    T* d = dstudent + r * V;
    if (labels[r] == kDivergenceIgnore) {
      for (int64_t v = 0; v < V; ++v) d[v] = T(0);
    } else {
      divergence_row(student + r * V, teacher + r * V, V, p, d, double(dloss));
    }
  }
}

template double divergence_row<float>(const float*, const float*, int64_t, const DivergenceParams&,
                                      float*, double);
template double divergence_row<double>(const double*, const double*, int64_t,
                                       const DivergenceParams&, double*, double);
template double divergence_sum<float>(const float*, const float*, const int32_t*, int64_t, int64_t,
                                      const DivergenceParams&);
template double divergence_sum<double>(const double*, const double*, const int32_t*, int64_t,
                                       int64_t, const DivergenceParams&);
template void divergence_backward<float>(float, const float*, const float*, const int32_t*, float*,
                                         int64_t, int64_t, const DivergenceParams&);
template void divergence_backward<double>(double, const double*, const double*, const int32_t*,
                                          double*, int64_t, int64_t, const DivergenceParams&);

}  // namespace fusetune::kernels
