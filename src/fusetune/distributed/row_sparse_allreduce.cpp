#include "fusetune/distributed/row_sparse_allreduce.h"

#include <cstring>

#include "fusetune/core/dtype.h"

namespace fusetune::dist {
namespace {

int64_t row_count_of(const Tensor& g, const RowSet& rows) {
  return int64_t(g.nbytes()) / rows.row_bytes;
}

// Which gradients have a row set of the same row width on every rank.
std::vector<bool> sparse_on_every_rank(Communicator& comm, const std::vector<Tensor*>& grads,
                                       const std::string& what) {
  std::vector<int64_t> row_bytes(grads.size(), 0);
  for (size_t i = 0; i < grads.size(); ++i)
    if (const RowSet* r = grads[i]->nonzero_rows().get()) row_bytes[i] = r->row_bytes;
  std::vector<int64_t> summed = row_bytes;
  comm.allreduce_sum(summed.data(), int64_t(summed.size()), what + " (row sets)");
  std::vector<bool> sparse(grads.size());
  for (size_t i = 0; i < grads.size(); ++i)
    sparse[i] = row_bytes[i] > 0 && summed[i] == row_bytes[i] * comm.size();
  return sparse;
}

// The union of every rank's row set of the sparse gradients, from one sum of per-row counts.
std::vector<std::shared_ptr<const RowSet>> union_over_ranks(Communicator& comm,
                                                            const std::vector<Tensor*>& grads,
                                                            const std::vector<bool>& sparse,
                                                            const std::string& what) {
  std::vector<int64_t> counts;
  std::vector<size_t> start(grads.size(), 0);
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!sparse[i]) continue;
    const RowSet& mine = *grads[i]->nonzero_rows();
    start[i] = counts.size();
    counts.resize(counts.size() + size_t(row_count_of(*grads[i], mine)), 0);
    for (int32_t r : mine.rows) counts[start[i] + size_t(r)] = 1;
  }
  comm.allreduce_sum(counts.data(), int64_t(counts.size()), what + " (row sets)");
  std::vector<std::shared_ptr<const RowSet>> unions(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!sparse[i]) continue;
    auto u = std::make_shared<RowSet>();
    u->row_bytes = grads[i]->nonzero_rows()->row_bytes;
    const int64_t rows = row_count_of(*grads[i], *u);
    for (int64_t r = 0; r < rows; ++r)
      if (counts[start[i] + size_t(r)] > 0) u->rows.push_back(int32_t(r));
    unions[i] = std::move(u);
  }
  return unions;
}

}  // namespace

std::vector<PackedRows> pack_row_sets(Communicator& comm, const std::vector<Tensor*>& grads,
                                      const std::string& what) {
  const std::vector<bool> sparse = sparse_on_every_rank(comm, grads, what);
  std::vector<std::shared_ptr<const RowSet>> unions;
  bool any = false;
  for (bool s : sparse) any |= s;
  if (any) unions = union_over_ranks(comm, grads, sparse, what);
  std::vector<PackedRows> out(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    Tensor& g = *grads[i];
    out[i].grad = &g;
    if (!sparse[i]) {
      g.drop_nonzero_rows();  // summed whole: any row may be non-zero after it
      out[i].packed = g;
      continue;
    }
    const RowSet& u = *unions[i];
    char* base = static_cast<char*>(g.raw());
    // Row u.rows[k] >= k: moving them to the front in increasing k never overwrites a row
    // still to be moved.
    for (size_t k = 0; k < u.rows.size(); ++k)
      if (int64_t(u.rows[k]) != int64_t(k))
        std::memcpy(base + int64_t(k) * u.row_bytes, base + int64_t(u.rows[k]) * u.row_bytes,
                    size_t(u.row_bytes));
    const int64_t elems = int64_t(u.rows.size()) * u.row_bytes / int64_t(dtype_size(g.dtype()));
    out[i].packed = Tensor::borrow(g.raw(), {elems}, g.dtype(), g.storage());
    out[i].rows = unions[i];
  }
  return out;
}

void unpack_row_sets(std::vector<PackedRows>& packed) {
  for (PackedRows& p : packed) {
    if (!p.rows) continue;
    const RowSet& u = *p.rows;
    char* base = static_cast<char*>(p.grad->raw());
    // Back in decreasing k: row k is read before any row moved back could land on it.
    for (size_t k = u.rows.size(); k-- > 0;)
      if (int64_t(u.rows[k]) != int64_t(k))
        std::memcpy(base + int64_t(u.rows[k]) * u.row_bytes, base + int64_t(k) * u.row_bytes,
                    size_t(u.row_bytes));
    // The front rows that held packed rows and are not in the union are zero again.
    size_t next = 0;
    for (int64_t k = 0; k < int64_t(u.rows.size()); ++k) {
      while (next < u.rows.size() && int64_t(u.rows[next]) < k) ++next;
      if (next < u.rows.size() && int64_t(u.rows[next]) == k) continue;
      std::memset(base + k * u.row_bytes, 0, size_t(u.row_bytes));
    }
    p.grad->storage()->set_nonzero_rows(p.rows);
    p.packed = Tensor();
  }
}

}  // namespace fusetune::dist
