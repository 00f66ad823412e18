#include "fusetune/kernels/cpu/embedding_rows.h"

#include <algorithm>
#include <memory>

#include "fusetune/kernels/cpu/kernels.h"

namespace fusetune::kernels {

const std::vector<int32_t>* embedding_rows_to_clear(const Tensor& dtable) {
  const std::shared_ptr<const RowSet>& known = dtable.nonzero_rows();
  const int64_t row_bytes = int64_t(dtable.nbytes()) / std::max<int64_t>(1, dtable.dim(0));
  // A buffer reused from a tensor of another row width: its rows are not these rows.
  if (!known || known->row_bytes != row_bytes) return nullptr;
  return &known->rows;
}

void record_embedding_rows(const Tensor& dtable, const int32_t* ids, int64_t n) {
  if (!sparse_embedding_grad_enabled()) return dtable.drop_nonzero_rows();
  auto rows = std::make_shared<RowSet>();
  rows->row_bytes = int64_t(dtable.nbytes()) / std::max<int64_t>(1, dtable.dim(0));
  rows->rows = embedding_touched_rows(ids, n);
  dtable.storage()->set_nonzero_rows(std::move(rows));
}

}  // namespace fusetune::kernels
