#include "fusetune/recipes/kto_kl.h"

#include <string>
#include <vector>

#include "fusetune/data/sample.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

// Where a row's response is: the first and last positions whose shifted label is trained.
struct Span {
  int64_t first = -1, last = -1;
};

Span response_span(const Batch& b, int64_t r) {
  Span s;
  for (int64_t t = 0; t < b.seq_len; ++t)
    if (b.labels[size_t(r * b.seq_len + t)] != kIgnoreIndex) {
      if (s.first < 0) s.first = t;
      s.last = t;
    }
  FT_CHECK(s.first >= 0, "KTOLoss: row " + std::to_string(r) + " of the batch has no response");
  return s;
}

}  // namespace

Batch mismatched_completions(const Batch& b, const CollateOptions& opts) {
  FT_CHECK(b.doc_ids.empty(), "KTOLoss: the KL rows need unpacked rows");
  const int64_t R = b.batch_size, T = b.seq_len;
  std::vector<Sample> rows(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    const int64_t q = (r + R - 1) % R;  // the completion's row
    const Span p = response_span(b, r), c = response_span(b, q);
    Sample& s = rows[size_t(r)];
    // Row r's prompt: tokens 0..first (the first response token is first + 1).
    const int32_t* tok = b.tokens.data() + r * T;
    s.tokens.assign(tok, tok + p.first + 1);
    s.labels.assign(size_t(p.first + 1), kIgnoreIndex);
    // Row q's completion: tokens first + 1 .. last + 1, each trained where its shifted label
    // (one position earlier) is.
    for (int64_t t = c.first; t <= c.last; ++t) {
      s.tokens.push_back(b.tokens[size_t(q * T + t + 1)]);
      s.labels.push_back(b.labels[size_t(q * T + t)]);
    }
    truncate_sample(s, opts.max_seq_len);
  }
  std::vector<const Sample*> ptrs;
  for (const Sample& s : rows) ptrs.push_back(&s);
  return collate(ptrs, opts);
}

}  // namespace fusetune
