#pragma once
// The BPE model of a tokenizer.json: vocabulary, ranked merges and the merge loop, with the
// options Hugging Face tokenizers supports (byte_fallback, ignore_merges, unk/fuse_unk,
// continuing_subword_prefix, end_of_word_suffix). Results are cached per word.
#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace fusetune {

// Hash/equality that let unordered_map<std::string, ...> be searched with a string_view.
// The hash is a small multiply-xorshift over 8-byte words: tokens and words are short, and
// std::hash's murmur showed up in profiles.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ s.size();
    const char* p = s.data();
    size_t n = s.size();
    for (; n >= 8; n -= 8, p += 8) {
      uint64_t w;
      std::memcpy(&w, p, 8);
      h = mix(h ^ w);
    }
    uint64_t tail = 0;
    if (n > 0) std::memcpy(&tail, p, n);  // an empty view's data() may be null (UB for memcpy)
    return size_t(mix(h ^ tail));
  }
  static uint64_t mix(uint64_t x) {
    x *= 0xBF58476D1CE4E5B9ull;
    return x ^ (x >> 31);
  }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

struct BpeOptions {
  std::optional<std::string> unk_token;
  bool fuse_unk = false;
  bool byte_fallback = false;  // unknown characters become <0xXX> byte tokens
  bool ignore_merges = false;  // a word that is itself in the vocabulary is not merged (Llama 3)
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;
};

// Open-addressing table from a (left id, right id) pair to its merge: one probe sequence in one
// flat array, where std::unordered_map chases a heap node per lookup (cold misses dominate
// BPE on a 100k+ vocabulary).
class MergeTable {
 public:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  void reserve(size_t n);
  void insert_or_assign(uint64_t key, Merge m);
  const Merge* find(uint64_t key) const {
    if (slots_.empty()) return nullptr;
    for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return &s.merge;
      if (s.key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t(0);  // ids are < 2^30: never a real key
  struct Slot {
    uint64_t key = kEmpty;
    Merge merge{};
  };
  size_t slot_of(uint64_t key) const { return size_t((key * 0x9E3779B97F4A7C15ull) >> shift_); }
  void grow();
  std::vector<Slot> slots_;
  size_t mask_ = 0, size_ = 0;
  int shift_ = 64;
};

class BpeModel {
 public:
  // `where` names the file in error messages. Throws fusetune::Error when a merge names a
  // token that is not in the vocabulary, or its result is not in the vocabulary.
  BpeModel(StringMap<int32_t> vocab, const std::vector<std::pair<std::string, std::string>>& merges,
           BpeOptions options, const std::string& where);

  // tiktoken's model, where the vocabulary's ids are merge ranks: two adjacent symbols merge
  // when their concatenation is a token, the lowest-id result first (leftmost among equals).
  // The merge table holds every split of every token into two tokens, each with the rank of
  // the token it makes, so the merge loop below computes exactly tiktoken's byte_pair_merge.
  static std::unique_ptr<BpeModel> from_ranks(StringMap<int32_t> vocab, BpeOptions options,
                                              const std::string& where);

  // Appends the ids of one pre-tokenized word (valid UTF-8).
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  // nullptr when the id is not in the vocabulary.
  const std::string* id_to_token(int32_t id) const;
  int32_t max_id() const { return int32_t(id_to_token_.size()) - 1; }
  size_t size() const { return vocab_.size(); }
  size_t num_merges() const { return merges_.size(); }

 private:
  using Merge = MergeTable::Merge;
  void encode_uncached(std::string_view word, std::vector<int32_t>& out) const;
  void initial_symbols(std::string_view word, std::vector<int32_t>& ids) const;
  void merge_short(std::vector<int32_t>& ids) const;
  void merge_long(std::vector<int32_t>& ids) const;
  const Merge* find_merge(int32_t a, int32_t b) const;

  StringMap<int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  MergeTable merges_;
  // Ids of single-code-point tokens below U+0800 (the whole byte-level alphabet): the
  // per-character lookups of a new word skip the string hash map. -1 = not a token.
  std::vector<int32_t> small_char_ids_;
  BpeOptions opt_;
  std::optional<int32_t> unk_id_;
  std::array<int32_t, 256> byte_ids_{};  // <0xXX> ids for byte_fallback; -1 when absent

  // Bounded word cache, sharded to keep lock contention low when loader threads share one
  // tokenizer. Like tokenizers' cache, a full shard takes no new words (no eviction churn;
  // frequent words arrive early). Ids live in one arena per shard: no allocation per word.
  static constexpr size_t kShards = 16, kShardCapacity = 4096, kMaxCachedWord = 64;
  struct Shard {
    std::mutex mu;
    StringMap<std::pair<uint32_t, uint32_t>> map;  // word -> (offset, count) in ids
    std::vector<int32_t> ids;
  };
  mutable std::array<Shard, kShards> cache_;
};

}  // namespace fusetune
