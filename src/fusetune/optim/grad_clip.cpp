#include "fusetune/optim/grad_clip.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "fusetune/optim/parallel_min.h"
#include "fusetune/optim/stochastic_rounding.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

// Block size of the deterministic reduction: independent of the thread count.
constexpr int64_t kReduceBlock = 8192;

template <class T>
double sum_squares(const T* g, int64_t n) {
  const int64_t blocks = (n + kReduceBlock - 1) / kReduceBlock;
  std::vector<double> partial(size_t(blocks), 0.0);
#pragma omp parallel for schedule(static) if (n >= kOptimizerParallelMin)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * kReduceBlock, end = std::min(n, (b + 1) * kReduceBlock);
    // Eight independent accumulators: a fixed order the compiler can vectorize.
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = begin;
    for (; i + 8 <= end; i += 8)
      for (int j = 0; j < 8; ++j) {
        const double x = double(bf16::load(g[i + j]));
        acc[j] += x * x;
      }
    for (; i < end; ++i) {
      const double x = double(bf16::load(g[i]));
      acc[0] += x * x;
    }
    partial[size_t(b)] =
        ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  }
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

template <class T>
void scale_in_place(T* g, T s, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kOptimizerParallelMin)
  for (int64_t i = 0; i < n; ++i) g[i] = g[i] * s;
}

// BF16 gradients: the product in fp32, rounded to nearest (a one-off scaling, not an
// accumulation: the half-ulp error does not build up, so no stochastic rounding is needed).
void scale_in_place(uint16_t* g, float s, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kOptimizerParallelMin)
  for (int64_t i = 0; i < n; ++i) g[i] = bf16::round_nearest(bf16::to_f32(g[i]) * s);
}

}  // namespace

double grad_sum_squares(const std::vector<ParamRef>& params) {
  check_params(params, "clip_grad_norm");
  double total = 0;
  for (const ParamRef& p : params) {
    if (!has_grad(p)) continue;
    const Tensor& g = *p.grad;
    total += g.dtype() == DType::F32    ? sum_squares(g.data<float>(), g.numel())
             : g.dtype() == DType::BF16 ? sum_squares(g.data<uint16_t>(), g.numel())
                                        : sum_squares(g.data<double>(), g.numel());
  }
  return total;
}

double grad_norm(const std::vector<ParamRef>& params) {
  return std::sqrt(grad_sum_squares(params));
}

double clip_grad_norm(const std::vector<ParamRef>& params, double max_norm) {
  FT_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be > 0, got " + std::to_string(max_norm));
  const double total = grad_norm(params);
  clip_to_norm(params, max_norm, total);
  return total;
}

void clip_to_norm(const std::vector<ParamRef>& params, double max_norm, double total) {
  FT_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be > 0, got " + std::to_string(max_norm));
  if (!std::isfinite(total)) return;
  const double coef = max_norm / (total + 1e-6);
  if (coef >= 1) return;
  for (const ParamRef& p : params) {
    if (!has_grad(p)) continue;
    Tensor& g = *p.grad;
    if (g.dtype() == DType::F32)
      scale_in_place(g.data<float>(), float(coef), g.numel());
    else if (g.dtype() == DType::BF16)
      scale_in_place(g.data<uint16_t>(), float(coef), g.numel());
    else
      scale_in_place(g.data<double>(), coef, g.numel());
  }
}

}  // namespace fusetune
