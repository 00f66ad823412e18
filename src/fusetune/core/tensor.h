#pragma once
// A dense, contiguous, row-major tensor over reference-counted storage. Copies share storage;
// reshape() is a view. Storage is either counted memory (memory.h) or borrowed bytes kept
// alive by an owner (an mmap'd checkpoint, say).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fusetune/core/dtype.h"

namespace fusetune {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);  // "[4, 256, 64]"

class Storage {
 public:
  explicit Storage(size_t bytes);                                        // counted, uninitialized
  Storage(void* data, size_t bytes, std::shared_ptr<const void> owner);  // borrowed
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void* data_;
  size_t bytes_;
  bool counted_;
  std::shared_ptr<const void> owner_;
};

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(Shape shape, DType dtype);
  static Tensor zeros(Shape shape, DType dtype);
  // Wraps bytes owned elsewhere; `owner` keeps them alive as long as the tensor lives.
  static Tensor borrow(void* data, Shape shape, DType dtype, std::shared_ptr<const void> owner);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[i < 0 ? shape_.size() + i : i]; }
  int rank() const { return int(shape_.size()); }
  DType dtype() const { return dtype_; }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }

  void* raw() const { return static_cast<char*>(storage_->data()) + offset_; }
  template <class T>
  T* data() const {
    return static_cast<T*>(raw());
  }

  Tensor reshape(Shape shape) const;  // view; numel must match
  Tensor clone() const;               // deep copy
  Tensor to(DType dtype) const;       // converted copy (float types <-> float types)
  void fill_zero();
  bool shares_storage(const Tensor& o) const { return storage_ == o.storage_; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;
  Shape shape_;
  DType dtype_ = DType::F32;
};

// Reads element i of a floating tensor (F32/F64/BF16/F16) as double. For tests and I/O.
double element_as_double(const Tensor& t, int64_t i);

}  // namespace fusetune
