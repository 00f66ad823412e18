#pragma once
// An embedding gradient's row set (core/tensor.h's RowSet, docs/design.md §5): the backward
// zeroes only the rows a reused buffer may hold, scatters the batch's rows, and records them, so
// that everything after it (accumulation, the norm, the sum over ranks, AdamW) reads those rows
// only. FUSETUNE_SPARSE_EMBEDDING_GRAD=0 records nothing: every reader then goes dense.
#include <cstdint>
#include <vector>

#include "fusetune/core/tensor.h"

namespace fusetune::kernels {

// The rows of the [V, D] gradient `dtable` that may be non-zero before the backward writes it,
// or null when unknown (then the whole table is zeroed). Valid until record_embedding_rows.
const std::vector<int32_t>* embedding_rows_to_clear(const Tensor& dtable);

// After the backward: `dtable`'s row set becomes the rows of `ids` (none when switched off).
void record_embedding_rows(const Tensor& dtable, const int32_t* ids, int64_t n);

}  // namespace fusetune::kernels
