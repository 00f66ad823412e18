#pragma once
// Samples -> one Batch. This is where labels get shifted (shift_labels, sample.h).
//
// Unpacked samples are right-padded to a common length T chosen by PadMode, so that shapes
// repeat across steps (a compiled plan or an arena sized for T is reused):
//   kMultiple    T = longest rounded up to a multiple of pad_multiple (default 64)
//   kPowerOfTwo  T = next power of two >= longest
//   kLongest     T = longest (no bucketing)
//   kFixed       T = max_seq_len always
// T is capped at max_seq_len when that is > 0 (a sample longer than it is an error: datasets
// truncate). Padding: tokens = pad_id, labels = -100; positions are 0..T-1; doc_ids empty.
// Packed rows (doc_ids set) are already max_seq_len long: they are stacked as they are, with
// labels shifted and positions restarted per document, and Batch::doc_ids filled.
#include <cstdint>
#include <string>
#include <vector>

#include "fusetune/data/batch.h"
#include "fusetune/data/sample.h"

namespace fusetune {

enum class PadMode { kMultiple, kPowerOfTwo, kLongest, kFixed };

struct CollateOptions {
  PadMode pad_mode = PadMode::kMultiple;
  int64_t pad_multiple = 64;
  int64_t max_seq_len = 0;  // cap on T; required (> 0) for kFixed
  int32_t pad_id = 0;       // from the tokenizer
};

// Parses "multiple" | "pow2" | "longest" | "fixed" (config spelling); throws otherwise.
PadMode parse_pad_mode(const std::string& s);

// The padded length T for a batch whose longest sample has `longest` tokens.
int64_t padded_length(int64_t longest, const CollateOptions& opts);

Batch collate(const std::vector<const Sample*>& items, const CollateOptions& opts);

}  // namespace fusetune
