// Embedding lookup and its scatter-add backward. The backward has no atomics: threads own
// column blocks of the table and walk all ids in order, so every dtable element is summed in
// the same order whatever the thread count.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/kernels/cpu/parallel.h"
#include "fusetune/util/error.h"

namespace fusetune::kernels {
namespace {

void check_ids(const char* op, const int32_t* ids, int64_t n, int64_t D, int64_t V) {
  FT_CHECK(n >= 0 && D >= 1 && V >= 1, std::string(op) + ": bad shape n=" + std::to_string(n) +
                                           " D=" + std::to_string(D) + " V=" + std::to_string(V));
  for (int64_t i = 0; i < n; ++i) {
    FT_CHECK(ids[i] >= 0 && ids[i] < V,
             std::string(op) + ": token id " + std::to_string(ids[i]) + " at position " +
                 std::to_string(i) + " is outside the vocabulary of size " + std::to_string(V));
  }
}

}  // namespace

template <class T>
void embedding_forward(const T* table, const int32_t* ids, T* out, int64_t n, int64_t D,
                       int64_t V) {
  check_ids("embedding_forward", ids, n, D, V);
#pragma omp parallel for schedule(static) if (n * D >= detail::kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(out + i * D, table + static_cast<int64_t>(ids[i]) * D, sizeof(T) * D);
  }
}

template <class T>
void embedding_backward(const T* dy, const int32_t* ids, T* dtable, int64_t n, int64_t D, int64_t V,
                        const std::vector<int32_t>* clear_rows) {
  check_ids("embedding_backward", ids, n, D, V);
  if (clear_rows) {
    for (int32_t r : *clear_rows)
      std::fill(dtable + int64_t(r) * D, dtable + int64_t(r + 1) * D, T(0));
  } else {
#pragma omp parallel for simd schedule(static) if (parallel : V * D >= detail::kParallelMin)
    for (int64_t k = 0; k < V * D; ++k) dtable[k] = T(0);
  }
  constexpr int64_t kBlock = 128;  // columns per task (512 bytes of float)
  const int64_t nblocks = (D + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n * D >= detail::kParallelMin && nblocks > 1)
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    const int64_t c0 = blk * kBlock;
    const int64_t w = std::min(kBlock, D - c0);
    for (int64_t i = 0; i < n; ++i) {
      T* dst = dtable + static_cast<int64_t>(ids[i]) * D + c0;
      const T* src = dy + i * D + c0;
#pragma omp simd
      for (int64_t j = 0; j < w; ++j) dst[j] += src[j];
    }
  }
}

template void embedding_forward<float>(const float*, const int32_t*, float*, int64_t, int64_t,
                                       int64_t);
template void embedding_forward<double>(const double*, const int32_t*, double*, int64_t, int64_t,
                                        int64_t);
// bf16 tables (dtype: bf16): a lookup copies the rows' bits.
template void embedding_forward<uint16_t>(const uint16_t*, const int32_t*, uint16_t*, int64_t,
                                          int64_t, int64_t);
template void embedding_backward<float>(const float*, const int32_t*, float*, int64_t, int64_t,
                                        int64_t, const std::vector<int32_t>*);
template void embedding_backward<double>(const double*, const int32_t*, double*, int64_t, int64_t,
                                         int64_t, const std::vector<int32_t>*);

std::vector<int32_t> embedding_touched_rows(const int32_t* ids, int64_t n) {
  std::vector<int32_t> rows(ids, ids + n);
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

bool sparse_embedding_grad_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("FUSETUNE_SPARSE_EMBEDDING_GRAD");
    const std::string s = v ? v : "1";
    FT_CHECK(s == "0" || s == "1",
             "FUSETUNE_SPARSE_EMBEDDING_GRAD must be 0 (dense embedding gradients) or 1 (row sets, "
             "the default), got '" +
                 s + "'");
    return s == "1";
  }();
  return on;
}

}  // namespace fusetune::kernels
