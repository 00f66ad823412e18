#include "fusetune/data/dataset.h"

#include "fusetune/util/error.h"

namespace fusetune {

std::string DatasetReport::summary() const {
  std::string s =
      name + ": " + std::to_string(examples) + " examples, " + std::to_string(tokens) + " tokens";
  if (packed_rows > 0) s += ", packed into " + std::to_string(packed_rows) + " rows";
  if (truncated > 0) s += ", " + std::to_string(truncated) + " truncated to max_seq_len";
  if (dropped_no_targets > 0)
    s += ", " + std::to_string(dropped_no_targets) + " dropped (no trained tokens)";
  if (bad_rows_skipped > 0)
    s += ", " + std::to_string(bad_rows_skipped) + " bad rows skipped (first: " + first_bad_row +
         ")";
  return s;
}

SampleDataset::SampleDataset(std::vector<Sample> samples, DatasetReport report)
    : samples_(std::move(samples)), report_(std::move(report)) {}

const Sample& SampleDataset::get(int64_t i) const {
  FT_CHECK(i >= 0 && i < size(), "dataset " + report_.name + ": index " + std::to_string(i) +
                                     " out of range [0, " + std::to_string(size()) + ")");
  return samples_[i];
}

}  // namespace fusetune
