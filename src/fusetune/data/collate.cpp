#include "fusetune/data/collate.h"

#include <algorithm>
#include <string>

#include "fusetune/util/error.h"

namespace fusetune {

PadMode parse_pad_mode(const std::string& s) {
  if (s == "multiple") return PadMode::kMultiple;
  if (s == "pow2" || s == "power_of_two") return PadMode::kPowerOfTwo;
  if (s == "longest") return PadMode::kLongest;
  if (s == "fixed") return PadMode::kFixed;
  throw Error("padding mode '" + s + "' is not one of multiple, pow2, longest, fixed");
}

int64_t padded_length(int64_t longest, const CollateOptions& o) {
  int64_t t = longest;
  switch (o.pad_mode) {
    case PadMode::kMultiple:
      FT_CHECK(o.pad_multiple > 0,
               "pad_multiple must be > 0, got " + std::to_string(o.pad_multiple));
      t = (longest + o.pad_multiple - 1) / o.pad_multiple * o.pad_multiple;
      break;
    case PadMode::kPowerOfTwo:
      t = 1;
      while (t < longest) t *= 2;
      break;
    case PadMode::kLongest:
      break;
    case PadMode::kFixed:
      FT_CHECK(o.max_seq_len > 0, "fixed-length padding needs max_seq_len > 0");
      return o.max_seq_len;
  }
  if (o.max_seq_len > 0) t = std::min(t, o.max_seq_len);
  return std::max<int64_t>(t, 1);
}

Batch collate(const std::vector<const Sample*>& items, const CollateOptions& o) {
  FT_CHECK(!items.empty(), "collate: empty batch");
  bool packed = items[0]->doc_ids.size() > 0;
  int64_t longest = 0;
  for (const Sample* s : items) {
    FT_CHECK((s->doc_ids.size() > 0) == packed, "collate: batch mixes packed rows and samples");
    FT_CHECK(s->labels.size() == s->tokens.size(),
             "collate: sample has " + std::to_string(s->tokens.size()) + " tokens but " +
                 std::to_string(s->labels.size()) + " labels");
    longest = std::max<int64_t>(longest, static_cast<int64_t>(s->tokens.size()));
  }
  const int64_t T = packed ? longest : padded_length(longest, o);
  Batch b;
  b.batch_size = static_cast<int64_t>(items.size());
  b.seq_len = T;
  b.tokens.reserve(b.batch_size * T);
  b.labels.reserve(b.batch_size * T);
  b.positions.reserve(b.batch_size * T);
  for (const Sample* s : items) {
    const int64_t n = static_cast<int64_t>(s->tokens.size());
    FT_CHECK(n <= T, "collate: a sample of " + std::to_string(n) +
                         " tokens is longer than the padded length " + std::to_string(T) +
                         " (max_seq_len " + std::to_string(o.max_seq_len) + ")");
    FT_CHECK(!packed || n == T, "collate: packed rows differ in length");
    std::vector<int32_t> shifted = shift_labels(s->labels, s->doc_ids);
    b.lengths.push_back(static_cast<int32_t>(n));
    b.tokens.insert(b.tokens.end(), s->tokens.begin(), s->tokens.end());
    b.tokens.insert(b.tokens.end(), T - n, o.pad_id);
    b.labels.insert(b.labels.end(), shifted.begin(), shifted.end());
    b.labels.insert(b.labels.end(), T - n, kIgnoreIndex);
    if (packed) {
      std::vector<int32_t> pos = positions_for(n, s->doc_ids);
      b.positions.insert(b.positions.end(), pos.begin(), pos.end());
      b.doc_ids.insert(b.doc_ids.end(), s->doc_ids.begin(), s->doc_ids.end());
    } else {
      for (int64_t i = 0; i < T; ++i) b.positions.push_back(static_cast<int32_t>(i));
    }
  }
  return b;
}

}  // namespace fusetune
