#include "fusetune/core/tensor.h"

#include <cstring>

#include "fusetune/core/memory.h"
#include "fusetune/util/error.h"

namespace fusetune {

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

Storage::Storage(size_t bytes) : data_(memory::allocate(bytes)), bytes_(bytes), counted_(true) {}

Storage::Storage(void* data, size_t bytes, std::shared_ptr<const void> owner)
    : data_(data), bytes_(bytes), counted_(false), owner_(std::move(owner)) {}

Storage::Storage(size_t bytes, bool reuse_known_rows)
    : data_(nullptr), bytes_(bytes), counted_(true) {
  memory::Note note;
  data_ = memory::allocate(bytes, reuse_known_rows ? &note : nullptr);
  // Every note in the block cache is a row set: only ~Storage below writes one.
  nonzero_rows_ = std::static_pointer_cast<const RowSet>(std::move(note));
}

Storage::~Storage() {
  if (counted_) memory::release(data_, bytes_, std::move(nonzero_rows_));
}

Tensor Tensor::empty(Shape shape, DType dtype) {
  for (auto d : shape) FT_CHECK(d >= 0, "negative dimension in shape " + shape_str(shape));
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(t.nbytes());
  return t;
}

Tensor Tensor::reusing_rows(Shape shape, DType dtype) {
  for (auto d : shape) FT_CHECK(d >= 0, "negative dimension in shape " + shape_str(shape));
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(t.nbytes(), true);
  return t;
}

const std::shared_ptr<const RowSet>& Tensor::nonzero_rows() const {
  static const std::shared_ptr<const RowSet> kDense;
  return storage_ ? storage_->nonzero_rows() : kDense;
}

void Tensor::drop_nonzero_rows() const {
  if (storage_) storage_->set_nonzero_rows(nullptr);
}

Tensor Tensor::zeros(Shape shape, DType dtype) {
  Tensor t = empty(std::move(shape), dtype);
  t.fill_zero();
  return t;
}

Tensor Tensor::borrow(void* data, Shape shape, DType dtype, std::shared_ptr<const void> owner) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(data, t.nbytes(), std::move(owner));
  return t;
}

Tensor Tensor::reshape(Shape shape) const {
  FT_CHECK(shape_numel(shape) == numel(),
           "cannot reshape " + shape_str(shape_) + " to " + shape_str(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_);
  if (nbytes()) std::memcpy(t.raw(), raw(), nbytes());
  return t;
}

void Tensor::fill_zero() {
  if (nbytes()) std::memset(raw(), 0, nbytes());
}

double element_as_double(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::F32:
      return t.data<float>()[i];
    case DType::F64:
      return t.data<double>()[i];
    case DType::BF16:
      return bf16_to_f32(t.data<uint16_t>()[i]);
    case DType::F16:
      return f16_to_f32(t.data<uint16_t>()[i]);
    case DType::I32:
      return t.data<int32_t>()[i];
    case DType::I64:
      return double(t.data<int64_t>()[i]);
  }
  return 0;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return clone();
  Tensor out = empty(shape_, dtype);
  const int64_t n = numel();
  switch (dtype) {
    case DType::F32:
      for (int64_t i = 0; i < n; ++i) out.data<float>()[i] = float(element_as_double(*this, i));
      break;
    case DType::F64:
      for (int64_t i = 0; i < n; ++i) out.data<double>()[i] = element_as_double(*this, i);
      break;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i)
        out.data<uint16_t>()[i] = f32_to_bf16(float(element_as_double(*this, i)));
      break;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i)
        out.data<uint16_t>()[i] = f32_to_f16(float(element_as_double(*this, i)));
      break;
    default:
      throw Error(std::string("cannot convert ") + dtype_name(dtype_) + " to " + dtype_name(dtype));
  }
  return out;
}

}  // namespace fusetune
