#pragma once
// An NF4 copy of a float64 weight for kernel tests: the quantized storage, a view of it, and
// its dequantized dense form (what the NF4 kernels must behave like).
#include <cstdint>
#include <vector>

#include "fusetune/kernels/cpu/nf4.h"

namespace fusetune::testing {

struct NF4Weight {
  std::vector<int32_t> codes, absmax;
  std::vector<float> scales;
  float offset = 0;
  int64_t rows = 0, cols = 0;
  kernels::NF4View view() const {
    return {codes.data(), absmax.data(), scales.data(), offset, rows, cols};
  }
  std::vector<double> dequantized() const {
    std::vector<double> d(size_t(rows * cols));
    kernels::nf4_dequantize_rows<double>(view(), 0, rows, d.data());
    return d;
  }
};

inline NF4Weight quantize_nf4(const std::vector<double>& w, int64_t rows, int64_t cols) {
  const kernels::NF4Sizes sz = kernels::nf4_sizes(rows * cols);
  NF4Weight q;
  q.codes.resize(size_t(sz.code_words));
  q.absmax.resize(size_t(sz.absmax_words));
  q.scales.resize(size_t(sz.scales));
  q.rows = rows;
  q.cols = cols;
  kernels::nf4_quantize<double>(w.data(), rows * cols, q.codes.data(), q.absmax.data(),
                                q.scales.data(), &q.offset);
  return q;
}

}  // namespace fusetune::testing
