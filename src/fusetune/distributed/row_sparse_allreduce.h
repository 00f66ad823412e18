#pragma once
// The sum over ranks of gradients with row sets (an embedding's: core/tensor.h), reading only
// the rows some rank touched (docs/design.md §8). The ranks first agree on which gradients
// have a row set on every rank and sum, per such gradient, a count per row (their union);
// each then packs the union's rows to the front of its own buffer (in place: no copy), the
// packed prefix is summed like any gradient, and the rows go back to their places. Each
// element is the same sum of the same values as in the dense all-reduce, so the result is
// bitwise the dense one; the gradient's row set becomes the union.
#include <memory>
#include <string>
#include <vector>

#include "fusetune/core/tensor.h"
#include "fusetune/distributed/communicator.h"

namespace fusetune::dist {

struct PackedRows {
  Tensor* grad = nullptr;
  std::shared_ptr<const RowSet> rows;  // the union; null: `grad` is summed whole
  Tensor packed;                       // the prefix of `grad` holding the union's rows
};

// Per gradient (same order on every rank): what to sum in its place. A gradient that lacks a row
// set on some rank is summed whole, and loses its row set.
std::vector<PackedRows> pack_row_sets(Communicator& comm, const std::vector<Tensor*>& grads,
                                      const std::string& what);

// After the sum: each packed gradient's rows back in their places, the rest zero.
void unpack_row_sets(std::vector<PackedRows>& packed);

}  // namespace fusetune::dist
