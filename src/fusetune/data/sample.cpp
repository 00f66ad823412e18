#include "fusetune/data/sample.h"

#include "fusetune/util/error.h"

namespace fusetune {

std::vector<int32_t> shift_labels(const std::vector<int32_t>& labels,
                                  const std::vector<int32_t>& doc_ids) {
  FT_CHECK(doc_ids.empty() || doc_ids.size() == labels.size(),
           "shift_labels: doc_ids has " + std::to_string(doc_ids.size()) + " entries, labels " +
               std::to_string(labels.size()));
  std::vector<int32_t> out(labels.size(), kIgnoreIndex);
  for (size_t i = 0; i + 1 < labels.size(); ++i) {
    if (!doc_ids.empty() && doc_ids[i] != doc_ids[i + 1]) continue;  // never across documents
    out[i] = labels[i + 1];
  }
  return out;
}

std::vector<int32_t> positions_for(size_t length, const std::vector<int32_t>& doc_ids) {
  FT_CHECK(doc_ids.empty() || doc_ids.size() == length,
           "positions_for: doc_ids has " + std::to_string(doc_ids.size()) + " entries, row " +
               std::to_string(length));
  std::vector<int32_t> pos(length);
  int32_t p = 0;
  for (size_t i = 0; i < length; ++i) {
    if (i > 0 && !doc_ids.empty() && doc_ids[i] != doc_ids[i - 1]) p = 0;
    pos[i] = p++;
  }
  return pos;
}

int64_t count_targets(const Sample& s) {
  int64_t n = 0;
  for (int32_t l : shift_labels(s.labels, s.doc_ids)) n += l != kIgnoreIndex;
  return n;
}

bool truncate_sample(Sample& s, int64_t max_len) {
  if (max_len <= 0 || static_cast<int64_t>(s.tokens.size()) <= max_len) return false;
  s.tokens.resize(max_len);
  s.labels.resize(max_len);
  if (!s.doc_ids.empty()) s.doc_ids.resize(max_len);
  return true;
}

}  // namespace fusetune
