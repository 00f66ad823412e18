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

// Row sparsity (docs/design.md §5): the rows of a buffer, `row_bytes` each, that may hold non-zero
// bytes; every other row is all zero bits. An embedding's gradient carries the rows its batch
// touched (ops/data_movement.h), so that zeroing it, its norm, its sum over ranks and the update
// read those rows only. A writer that may write elsewhere drops it (Storage::set_nonzero_rows).
struct RowSet {
  int64_t row_bytes = 0;
  std::vector<int32_t> rows;  // sorted, unique
};

class Storage {
 public:
  explicit Storage(size_t bytes);  // counted, uninitialized
  // Counted, holding what a freed buffer of this size held: nonzero_rows() says which rows may
  // be non-zero when the buffer's row set was known, else it is null (contents unknown).
  Storage(size_t bytes, bool reuse_known_rows);
  Storage(void* data, size_t bytes, std::shared_ptr<const void> owner);  // borrowed
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  // Null: any byte may be non-zero. A freed buffer keeps its row set while it waits for reuse.
  const std::shared_ptr<const RowSet>& nonzero_rows() const { return nonzero_rows_; }
  void set_nonzero_rows(std::shared_ptr<const RowSet> rows) { nonzero_rows_ = std::move(rows); }

 private:
  void* data_;
  size_t bytes_;
  bool counted_;
  std::shared_ptr<const void> owner_;
  std::shared_ptr<const RowSet> nonzero_rows_;
};

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(Shape shape, DType dtype);
  static Tensor zeros(Shape shape, DType dtype);
  // Like empty(), but when it reuses a freed buffer whose row set was known, the storage's
  // nonzero_rows() says which rows may be non-zero (so that zeroing it costs only those rows).
  static Tensor reusing_rows(Shape shape, DType dtype);
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
  // The storage's row set (null: dense), and dropping it before a write it would not cover.
  const std::shared_ptr<const RowSet>& nonzero_rows() const;
  void drop_nonzero_rows() const;
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
