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

// The element ranges of a row set's rows (core/tensor.h), cut at the blocks' edges, in order.
struct BlockRange {
  int64_t block, begin, end;
};
std::vector<BlockRange> ranges_of_rows(const RowSet& rows, int64_t elem_bytes, int64_t n) {
  std::vector<BlockRange> out;
  const int64_t row_elems = rows.row_bytes / elem_bytes;
  for (int32_t r : rows.rows)
    for (int64_t at = int64_t(r) * row_elems, last = std::min(n, at + row_elems); at < last;) {
      const int64_t b = at / kReduceBlock, e = std::min(last, (b + 1) * kReduceBlock);
      if (!out.empty() && out.back().block == b && out.back().end == at)
        out.back().end = e;  // the next row of the same block
      else
        out.push_back({b, at, e});
      at = e;
    }
  return out;
}

// sum_squares of a gradient that is zero outside `rows`, bitwise: every other element is +0,
// and adding +0 to a lane (itself +0 or positive) leaves it as it is, so each lane adds the
// listed elements in the dense loop's order (the tail of a short block into lane 0, last) and
// skips the rest; blocks without a listed row have the partial +0, which the total skips too.
template <class T>
double sum_squares_of_rows(const T* g, int64_t n, const RowSet& rows) {
  const std::vector<BlockRange> ranges = ranges_of_rows(rows, int64_t(sizeof(T)), n);
  std::vector<size_t> starts;  // where each block's ranges begin
  for (size_t k = 0; k < ranges.size(); ++k)
    if (k == 0 || ranges[k].block != ranges[k - 1].block) starts.push_back(k);
  starts.push_back(ranges.size());
  const int64_t groups = int64_t(starts.size()) - 1;
  std::vector<double> partial(size_t(std::max<int64_t>(groups, 0)), 0.0);
#pragma omp parallel for schedule(static) if (groups * 256 >= kOptimizerParallelMin)
  for (int64_t k = 0; k < groups; ++k) {
    const int64_t begin = ranges[starts[size_t(k)]].block * kReduceBlock;
    const int64_t end = std::min(n, begin + kReduceBlock);
    const int64_t lanes_end = begin + (end - begin) / 8 * 8;  // the dense loop's tail after it
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (size_t r = starts[size_t(k)]; r < starts[size_t(k + 1)]; ++r)
      for (int64_t i = ranges[r].begin; i < ranges[r].end; ++i) {
        const double x = double(bf16::load(g[i]));
        acc[i < lanes_end ? (i - begin) % 8 : 0] += x * x;
      }
    partial[size_t(k)] =
        ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  }
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

template <class T>
double sum_squares(const T* g, int64_t n, const RowSet* rows) {
  return rows ? sum_squares_of_rows(g, n, *rows) : sum_squares(g, n);
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

void scale_range(const Tensor& g, double coef, int64_t begin, int64_t n) {
  if (g.dtype() == DType::F32)
    scale_in_place(g.data<float>() + begin, float(coef), n);
  else if (g.dtype() == DType::BF16)
    scale_in_place(g.data<uint16_t>() + begin, float(coef), n);
  else
    scale_in_place(g.data<double>() + begin, coef, n);
}

}  // namespace

double grad_sum_squares(const std::vector<ParamRef>& params) {
  check_params(params, "clip_grad_norm");
  double total = 0;
  for (const ParamRef& p : params) {
    if (!has_grad(p)) continue;
    const Tensor& g = *p.grad;
    const RowSet* rows = g.nonzero_rows().get();
    total += g.dtype() == DType::F32    ? sum_squares(g.data<float>(), g.numel(), rows)
             : g.dtype() == DType::BF16 ? sum_squares(g.data<uint16_t>(), g.numel(), rows)
                                        : sum_squares(g.data<double>(), g.numel(), rows);
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
    const Tensor& g = *p.grad;
    if (const RowSet* rows = g.nonzero_rows().get()) {
      // Only the rows that may be non-zero: +0 times the coefficient is +0 anyway.
      const int64_t row_elems = rows->row_bytes / int64_t(dtype_size(g.dtype()));
      for (int32_t r : rows->rows) scale_range(g, coef, int64_t(r) * row_elems, row_elems);
    } else {
      scale_range(g, coef, 0, g.numel());
    }
  }
}

}  // namespace fusetune
