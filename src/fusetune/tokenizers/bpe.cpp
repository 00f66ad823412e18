#include "fusetune/tokenizers/bpe.h"

#include <bit>
#include <cstdio>
#include <queue>

#include "fusetune/tokenizers/utf8.h"
#include "fusetune/util/error.h"

namespace fusetune {

void MergeTable::reserve(size_t n) {
  while (slots_.size() < 2 * n) grow();
}

void MergeTable::grow() {
  std::vector<Slot> old = std::move(slots_);
  size_t cap = old.empty() ? 16 : old.size() * 2;
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  shift_ = 64 - std::countr_zero(cap);
  size_ = 0;
  for (const Slot& s : old)
    if (s.key != kEmpty) insert_or_assign(s.key, s.merge);
}

void MergeTable::insert_or_assign(uint64_t key, Merge m) {
  if (2 * (size_ + 1) > slots_.size()) grow();  // load factor <= 1/2
  for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
    Slot& s = slots_[i];
    if (s.key == key) {
      s.merge = m;  // a repeated merge: the later rank wins, as in tokenizers
      return;
    }
    if (s.key == kEmpty) {
      s.key = key;
      s.merge = m;
      ++size_;
      return;
    }
  }
}

BpeModel::BpeModel(StringMap<int32_t> vocab,
                   const std::vector<std::pair<std::string, std::string>>& merges,
                   BpeOptions options, const std::string& where)
    : vocab_(std::move(vocab)), opt_(std::move(options)) {
  int32_t max_id = -1;
  for (const auto& [tok, id] : vocab_) {
    FT_CHECK(id >= 0,
             where + ": model.vocab token '" + tok + "' has negative id " + std::to_string(id));
    // Ids index a dense table: a stray huge id must not allocate gigabytes.
    FT_CHECK(size_t(id) < vocab_.size() + (1u << 20),
             where + ": model.vocab token '" + tok + "' has id " + std::to_string(id) +
                 ", far beyond the vocabulary's " + std::to_string(vocab_.size()) + " tokens");
    max_id = std::max(max_id, id);
  }
  id_to_token_.resize(size_t(max_id + 1));
  std::vector<bool> seen(id_to_token_.size(), false);
  for (const auto& [tok, id] : vocab_) {
    FT_CHECK(!seen[id], where + ": model.vocab gives id " + std::to_string(id) +
                            " to two tokens ('" + id_to_token_[id] + "' and '" + tok + "')");
    seen[id] = true;
    id_to_token_[id] = tok;
  }
  if (opt_.unk_token) {
    auto it = vocab_.find(*opt_.unk_token);
    FT_CHECK(it != vocab_.end(),
             where + ": model.unk_token '" + *opt_.unk_token + "' is not in model.vocab");
    unk_id_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = vocab_.find(std::string_view(name));
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }
  small_char_ids_.assign(0x800, -1);
  for (const auto& [tok, id] : vocab_) {
    if (tok.empty() || !utf8::is_valid(tok)) continue;
    size_t i = 0;
    char32_t cp = utf8::next(tok, i);
    if (i == tok.size() && cp < 0x800) small_char_ids_[cp] = id;
  }
  const size_t prefix_len = opt_.continuing_subword_prefix.size();
  merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    auto ia = vocab_.find(a), ib = vocab_.find(b);
    FT_CHECK(ia != vocab_.end() && ib != vocab_.end(),
             where + ": model.merges[" + std::to_string(rank) + "] ('" + a + "' '" + b +
                 "') names token '" + (ia == vocab_.end() ? a : b) +
                 "' that is not in model.vocab");
    FT_CHECK(b.size() >= prefix_len, where + ": model.merges[" + std::to_string(rank) +
                                         "] right token '" + b +
                                         "' is shorter than continuing_subword_prefix");
    std::string merged = a + b.substr(prefix_len);
    auto im = vocab_.find(merged);
    FT_CHECK(im != vocab_.end(), where + ": model.merges[" + std::to_string(rank) + "] ('" + a +
                                     "' '" + b + "') makes '" + merged +
                                     "', which is not in model.vocab");
    merges_.insert_or_assign(MergeTable::key(ia->second, ib->second),
                             Merge{int32_t(rank), im->second});
  }
}

std::unique_ptr<BpeModel> BpeModel::from_ranks(StringMap<int32_t> vocab, BpeOptions options,
                                               const std::string& where) {
  auto model = std::make_unique<BpeModel>(std::move(vocab),
                                          std::vector<std::pair<std::string, std::string>>{},
                                          std::move(options), where);
  MergeTable& merges = model->merges_;
  merges.reserve(model->vocab_.size() * 4);
  for (const auto& [tok, id] : model->vocab_) {
    // Split points at character boundaries: in byte-level form a character is one byte.
    size_t i = 0;
    if (tok.empty() || !utf8::is_valid(tok)) continue;
    utf8::next(tok, i);
    while (i < tok.size()) {
      auto left = model->vocab_.find(std::string_view(tok).substr(0, i));
      if (left != model->vocab_.end()) {
        auto right = model->vocab_.find(std::string_view(tok).substr(i));
        if (right != model->vocab_.end())
          merges.insert_or_assign(MergeTable::key(left->second, right->second), Merge{id, id});
      }
      utf8::next(tok, i);
    }
  }
  return model;
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || size_t(id) >= id_to_token_.size()) return nullptr;
  // Ids may have gaps; a gap holds an empty string that no vocab entry maps back to.
  const std::string& s = id_to_token_[id];
  if (s.empty()) {
    auto it = vocab_.find(std::string_view());
    if (it == vocab_.end() || it->second != id) return nullptr;
  }
  return &s;
}

const BpeModel::Merge* BpeModel::find_merge(int32_t a, int32_t b) const {
  return merges_.find(MergeTable::key(a, b));
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  const bool cacheable = word.size() <= kMaxCachedWord;
  const size_t h = cacheable ? StringHash{}(word) : 0;
  Shard& shard = cache_[h % kShards];
  // The cache comes first: it is small and hot, the vocabulary large and cold.
  if (cacheable) {
    std::lock_guard<std::mutex> lock(shard.mu);
    auto it = shard.map.find(word);
    if (it != shard.map.end()) {
      const int32_t* p = shard.ids.data() + it->second.first;
      out.insert(out.end(), p, p + it->second.second);
      return;
    }
  }
  const size_t first = out.size();
  auto whole = opt_.ignore_merges ? vocab_.find(word) : vocab_.end();
  if (whole != vocab_.end())
    out.push_back(whole->second);
  else
    encode_uncached(word, out);
  if (!cacheable) return;
  std::lock_guard<std::mutex> lock(shard.mu);
  if (shard.map.size() >= kShardCapacity) return;
  auto [it, inserted] = shard.map.try_emplace(std::string(word), uint32_t(shard.ids.size()),
                                              uint32_t(out.size() - first));
  if (inserted) shard.ids.insert(shard.ids.end(), out.begin() + first, out.end());
}

void BpeModel::initial_symbols(std::string_view w, std::vector<int32_t>& ids) const {
  // Mirrors tokenizers' BPE::merge_word: one symbol per character; a character missing from
  // the vocabulary becomes its <0xXX> bytes (byte_fallback) or the unk token (fused when
  // fuse_unk), or is dropped when the model has no unk token.
  int32_t pending_unk = -1;  // an unk symbol not yet emitted (fuse_unk extends it)
  std::string buf;
  const bool affixes = !opt_.continuing_subword_prefix.empty() || !opt_.end_of_word_suffix.empty();
  size_t i = 0;
  while (i < w.size()) {
    size_t start = i;
    char32_t cp = utf8::next(w, i);
    std::string_view s = w.substr(start, i - start);
    const bool first = start == 0, last = i >= w.size();
    int32_t id = -1;
    if (affixes && ((!first && !opt_.continuing_subword_prefix.empty()) ||
                    (last && !opt_.end_of_word_suffix.empty()))) {
      buf.clear();
      if (!first) buf += opt_.continuing_subword_prefix;
      buf += s;
      if (last) buf += opt_.end_of_word_suffix;
      s = buf;
      auto it = vocab_.find(s);
      if (it != vocab_.end()) id = it->second;
    } else if (cp < 0x800) {
      id = small_char_ids_[cp];
    } else {
      auto it = vocab_.find(s);
      if (it != vocab_.end()) id = it->second;
    }
    if (id >= 0) {
      if (pending_unk >= 0) ids.push_back(pending_unk);
      pending_unk = -1;
      ids.push_back(id);
      continue;
    }
    if (opt_.byte_fallback) {
      bool all = true;
      for (char c : s) all = all && byte_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        for (char c : s) ids.push_back(byte_ids_[static_cast<unsigned char>(c)]);
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk >= 0 && !opt_.fuse_unk) ids.push_back(pending_unk);
      pending_unk = *unk_id_;
    }
  }
  if (pending_unk >= 0) ids.push_back(pending_unk);
}

void BpeModel::encode_uncached(std::string_view word, std::vector<int32_t>& out) const {
  thread_local std::vector<int32_t> ids;
  ids.clear();
  initial_symbols(word, ids);
  if (ids.size() > 1 && !merges_.empty()) {
    if (ids.size() <= 48)
      merge_short(ids);
    else
      merge_long(ids);
  }
  out.insert(out.end(), ids.begin(), ids.end());
}

// Few symbols: scanning every adjacent pair for the lowest rank each round beats a heap.
// Ties go to the leftmost pair, as in the heap version (and tokenizers' Word::merge_all).
void BpeModel::merge_short(std::vector<int32_t>& ids) const {
  thread_local std::vector<const Merge*> pair_merge;
  size_t n = ids.size();
  pair_merge.resize(n);
  for (size_t k = 0; k + 1 < n; ++k) pair_merge[k] = find_merge(ids[k], ids[k + 1]);
  while (n > 1) {
    size_t best = n;
    int32_t best_rank = INT32_MAX;
    for (size_t k = 0; k + 1 < n; ++k)
      if (pair_merge[k] && pair_merge[k]->rank < best_rank) {
        best_rank = pair_merge[k]->rank;
        best = k;
      }
    if (best == n) break;
    ids[best] = pair_merge[best]->new_id;
    ids.erase(ids.begin() + best + 1);
    pair_merge.erase(pair_merge.begin() + best + 1);
    --n;
    if (best > 0) pair_merge[best - 1] = find_merge(ids[best - 1], ids[best]);
    pair_merge[best] = best + 1 < n ? find_merge(ids[best], ids[best + 1]) : nullptr;
  }
}

// Many symbols (e.g. a whole sentence when there is no pre-tokenizer): a doubly linked list
// of symbols and a min-heap of candidate merges ordered by (rank, position).
void BpeModel::merge_long(std::vector<int32_t>& ids) const {
  const int n = int(ids.size());
  std::vector<int> prev(n), next(n);
  for (int k = 0; k < n; ++k) {
    prev[k] = k - 1;
    next[k] = k + 1 < n ? k + 1 : -1;
  }
  struct Cand {
    int32_t rank;
    int pos;
    int32_t new_id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int pos) {
    if (pos < 0 || next[pos] < 0) return;
    if (const Merge* m = find_merge(ids[pos], ids[next[pos]])) heap.push({m->rank, pos, m->new_id});
  };
  for (int k = 0; k + 1 < n; ++k) push(k);
  std::vector<bool> dead(n, false);
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    if (dead[c.pos] || next[c.pos] < 0) continue;
    const int right = next[c.pos];
    const Merge* m = find_merge(ids[c.pos], ids[right]);
    if (!m || m->new_id != c.new_id || m->rank != c.rank) continue;  // stale entry
    ids[c.pos] = c.new_id;
    dead[right] = true;
    next[c.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  size_t w = 0;
  for (int k = 0; k >= 0 && k < n; k = next[k]) ids[w++] = ids[k];
  ids.resize(w);
}

}  // namespace fusetune
