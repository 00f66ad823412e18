// Negative log-likelihood over log-probabilities [rows, V]; label -100 marks an ignored row
// (PyTorch's ignore_index). Labels are checked before any work so a bad one never reads out
// of bounds.
#include <string>

#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/kernels/cpu/parallel.h"
#include "fusetune/util/error.h"

namespace fusetune::kernels {
namespace {

constexpr int32_t kIgnore = -100;

void check_labels(const char* op, const int32_t* labels, int64_t rows, int64_t V) {
  FT_CHECK(rows >= 0 && V >= 1, std::string(op) + ": bad shape rows=" + std::to_string(rows) +
                                    " V=" + std::to_string(V));
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t l = labels[r];
    FT_CHECK(l == kIgnore || (l >= 0 && l < V),
             std::string(op) + ": label " + std::to_string(l) + " at row " + std::to_string(r) +
                 " is outside [0, " + std::to_string(V) + ") (use -100 to ignore a position)");
  }
}

}  // namespace

template <class T>
double nll_sum(const T* logp, const int32_t* labels, int64_t rows, int64_t V) {
  check_labels("nll_sum", labels, rows, V);
  double s = 0.0;  // one read per row: serial, and deterministic by construction
  for (int64_t r = 0; r < rows; ++r) {
    if (labels[r] != kIgnore) s -= static_cast<double>(logp[r * V + labels[r]]);
  }
  return s;
}

template <class T>
void nll_backward(T dloss, const int32_t* labels, T* dx, int64_t rows, int64_t V) {
  check_labels("nll_backward", labels, rows, V);
#pragma omp parallel for schedule(static) if (rows * V >= detail::kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    T* d = dx + r * V;
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) d[j] = T(0);
    if (labels[r] != kIgnore) d[labels[r]] = -dloss;
  }
}

template double nll_sum<float>(const float*, const int32_t*, int64_t, int64_t);
template double nll_sum<double>(const double*, const int32_t*, int64_t, int64_t);
template void nll_backward<float>(float, const int32_t*, float*, int64_t, int64_t);
template void nll_backward<double>(double, const int32_t*, double*, int64_t, int64_t);

}  // namespace fusetune::kernels
