#pragma once
// One tokenized example, and the single place where labels are shifted.
//
// Convention (docs/design.md §1): datasets produce *unshifted* per-token targets, as Hugging Face
// does: labels[i] is tokens[i] when token i is trained on, kIgnoreIndex (-100) when it is
// not (prompt tokens with train_on_input: false, headers, padding). The collator turns them
// into what the model sees, labels[i] = target of position i = next token, with
// shift_labels() below; nothing else in the code base shifts. Packed rows carry doc_ids and
// are shifted per document, so the last token of a document gets -100 and never the first
// token of the next one.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fusetune/data/batch.h"

namespace fusetune {

struct Sample {
  std::vector<int32_t> tokens;
  std::vector<int32_t> labels;   // unshifted: tokens[i] or kIgnoreIndex, same length as tokens
  std::vector<int32_t> doc_ids;  // packed rows only: document index per token; empty = one doc
};

// Shifted targets for one row: out[i] = labels[i + 1] when tokens i and i + 1 are in the same
// document (doc_ids empty = all one document), else kIgnoreIndex; the last is kIgnoreIndex.
std::vector<int32_t> shift_labels(const std::vector<int32_t>& labels,
                                  const std::vector<int32_t>& doc_ids);

// RoPE positions for one row: 0, 1, 2, ... restarting at 0 whenever the doc id changes.
std::vector<int32_t> positions_for(std::size_t length, const std::vector<int32_t>& doc_ids);

// How many positions will carry a loss after shifting (labels[1..] that are not ignored,
// within a document). A sample with none teaches nothing.
int64_t count_targets(const Sample& s);

// Cuts tokens and labels (and doc_ids) to at most max_len; returns true when it cut.
// max_len <= 0 means no limit. No EOS is forced onto a cut sample: the text did not end there.
bool truncate_sample(Sample& s, int64_t max_len);

}  // namespace fusetune
