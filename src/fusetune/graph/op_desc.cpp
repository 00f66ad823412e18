// The helpers op descriptions share (op_desc.h); the descriptions are in src/fusetune/ops/.
#include "fusetune/graph/op_desc.h"

#include <algorithm>

#include "fusetune/util/error.h"

namespace fusetune {

void ShapeCheck::fail(const std::string& why) const {
  throw Error(std::string("shape error in ") + op_name(op) + ": " + why);
}

void ShapeCheck::need_float(size_t i) const {
  // A bf16 graph also holds fp32 values (bf16_storage_output); its kernels take either.
  if (T(i).dtype != fd && !(fd == DType::BF16 && T(i).dtype == DType::F32))
    fail("input " + std::to_string(i) + " must be " + dtype_name(fd) + ", got " +
         dtype_name(T(i).dtype));
}

void ShapeCheck::need_i32(size_t i) const {
  if (T(i).dtype != DType::I32) fail("input " + std::to_string(i) + " must be I32 ids");
}

void ShapeCheck::same(size_t i, size_t j) const {
  if (S(i) != S(j)) fail("shapes differ: " + shape_str(S(i)) + " vs " + shape_str(S(j)));
}

int ShapeCheck::norm_dim(int d, size_t rank) const {
  int r = int(rank);
  int nd = d < 0 ? d + r : d;
  if (nd < 0 || nd >= r)
    fail("dim " + std::to_string(d) + " out of range for rank " + std::to_string(r));
  return nd;
}

bool is_suffix(const Shape& small, const Shape& big) {
  if (small.size() > big.size()) return false;
  return std::equal(small.begin(), small.end(), big.end() - small.size());
}

Value VjpContext::unbroadcast(Value grad, const Shape& to) {
  if (g.shape(grad) == to) return grad;
  Attrs at;
  at.shape = to;
  return op(Op::SumToShape, {grad}, at);
}

Value VjpContext::reshape(Value v, Shape s) {
  Attrs at;
  at.shape = std::move(s);
  return op(Op::Reshape, {v}, at);
}

Value GradcheckCase::param(const std::string& name, Shape s, double lo, double hi) {
  params.push_back({name, s, lo, hi});
  return g.param(name, std::move(s), true);
}

Value GradcheckCase::ids(const std::string& name, Shape s, const std::vector<int32_t>& values) {
  Tensor t = Tensor::empty(s, DType::I32);
  FT_CHECK(int64_t(values.size()) == t.numel(),
           "GradcheckCase::ids: " + name + " needs " + std::to_string(t.numel()) + " values");
  std::copy(values.begin(), values.end(), t.data<int32_t>());
  inputs.push_back({name, t});
  return g.input(name, std::move(s), DType::I32);
}

}  // namespace fusetune
