#pragma once
// Packing (packed: true): samples, in dataset order, are laid end to end into rows of exactly
// max_seq_len tokens, so no compute goes to padding and every batch has the same shape.
//
// A row is a Sample with doc_ids: document index per token, 0, 1, 2, ... within the row;
// the padding that fills a row's tail is one more document of its own (pad id, labels -100).
// Labels stay unshifted here; the collator shifts them per document (sample.h), so no target
// crosses a document boundary, and positions restart at 0 for each document.
//
// A sample that does not fit in what is left of the current row:
//   split_across_rows: true  (default for text): fills the row; the rest continues in the
//       next row as a new document (positions restart at 0; the target of the last token
//       before the cut is lost, as no row sees both sides).
//   split_across_rows: false (default for prompt data): the row is padded and the sample
//       starts the next row; a sample longer than max_seq_len is truncated to it.
#include <memory>

#include "fusetune/data/dataset.h"

namespace fusetune {

class PackedDataset : public Dataset {
 public:
  PackedDataset(const Dataset& samples, int64_t max_seq_len, int32_t pad_id,
                bool split_across_rows);
  int64_t size() const override { return static_cast<int64_t>(rows_.size()); }
  const Sample& get(int64_t i) const override;
  const DatasetReport& report() const override { return report_; }
  bool packed() const override { return true; }

 private:
  std::vector<Sample> rows_;
  DatasetReport report_;
};

}  // namespace fusetune
