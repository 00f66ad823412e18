#pragma once
// A dataset is a fixed, fully tokenized list of samples (or of packed rows). Everything is
// tokenized when the dataset is built: bad rows fail (or are counted) before training starts,
// and random access for shuffling is free. The corpora a CPU fine-tune uses fit in memory.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fusetune/data/sample.h"

namespace fusetune {

// What loading did, for the run log ("alpaca.json: 98 examples, 2 bad rows skipped ...").
struct DatasetReport {
  std::string name;                // file name the samples came from
  int64_t rows_read = 0;           // rows in the selected split
  int64_t bad_rows_skipped = 0;    // on_bad_row: skip
  std::string first_bad_row;       // the first skipped row's error, to show the user
  int64_t truncated = 0;           // samples cut to max_seq_len
  int64_t dropped_no_targets = 0;  // samples with no trained token left (e.g. all prompt)
  int64_t examples = 0;            // samples kept
  int64_t tokens = 0;              // tokens in kept samples (before padding)
  int64_t packed_rows = 0;         // rows after packing (0 when not packed)
  std::string summary() const;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Item i: a sample, or a packed row of exactly max_seq_len tokens with doc_ids set.
  virtual const Sample& get(int64_t i) const = 0;
  virtual const DatasetReport& report() const = 0;
  virtual bool packed() const { return false; }
};

// The dataset every reader builds: samples in file order.
class SampleDataset : public Dataset {
 public:
  SampleDataset(std::vector<Sample> samples, DatasetReport report);
  int64_t size() const override { return static_cast<int64_t>(samples_.size()); }
  const Sample& get(int64_t i) const override;
  const DatasetReport& report() const override { return report_; }

 private:
  std::vector<Sample> samples_;
  DatasetReport report_;
};

}  // namespace fusetune
