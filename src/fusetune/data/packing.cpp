#include "fusetune/data/packing.h"

#include <algorithm>

#include "fusetune/util/error.h"

namespace fusetune {

PackedDataset::PackedDataset(const Dataset& samples, int64_t max_seq_len, int32_t pad_id,
                             bool split_across_rows)
    : report_(samples.report()) {
  FT_CHECK(max_seq_len > 0, "packed: true needs dataset max_seq_len > 0 (the row length)");
  const size_t cap = static_cast<size_t>(max_seq_len);
  Sample row;
  int32_t doc = 0;
  auto flush = [&] {
    if (row.tokens.empty()) return;
    if (row.tokens.size() < cap) {  // the tail is a document of its own
      size_t pad = cap - row.tokens.size();
      row.tokens.insert(row.tokens.end(), pad, pad_id);
      row.labels.insert(row.labels.end(), pad, kIgnoreIndex);
      row.doc_ids.insert(row.doc_ids.end(), pad, doc);
    }
    rows_.push_back(std::move(row));
    row = Sample();
    doc = 0;
  };
  auto append = [&](const Sample& s, size_t begin, size_t end) {
    row.tokens.insert(row.tokens.end(), s.tokens.begin() + begin, s.tokens.begin() + end);
    row.labels.insert(row.labels.end(), s.labels.begin() + begin, s.labels.begin() + end);
    row.doc_ids.insert(row.doc_ids.end(), end - begin, doc++);
  };

  for (int64_t i = 0; i < samples.size(); ++i) {
    const Sample& s = samples.get(i);
    FT_CHECK(s.doc_ids.empty(), "packing: item " + std::to_string(i) + " is already packed");
    size_t n = s.tokens.size();
    if (split_across_rows) {
      for (size_t off = 0; off < n;) {
        size_t take = std::min(n - off, cap - row.tokens.size());
        append(s, off, off + take);
        off += take;
        if (row.tokens.size() == cap) flush();
      }
    } else {
      if (n > cap) {
        n = cap;
        ++report_.truncated;
      }
      if (row.tokens.size() + n > cap) flush();
      append(s, 0, n);
      if (row.tokens.size() == cap) flush();
    }
  }
  flush();
  report_.packed_rows = static_cast<int64_t>(rows_.size());
}

const Sample& PackedDataset::get(int64_t i) const {
  FT_CHECK(i >= 0 && i < size(), "packed dataset " + report_.name + ": row " + std::to_string(i) +
                                     " out of range [0, " + std::to_string(size()) + ")");
  return rows_[i];
}

}  // namespace fusetune
