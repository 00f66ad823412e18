#pragma once
// The BPE model of a tokenizer.json: vocabulary, ranked merges and the merge loop, with the
// options Hugging Face tokenizers supports (byte_fallback, ignore_merges, unk/fuse_unk,
// continuing_subword_prefix, end_of_word_suffix). Results are cached per word.
#include <array>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace fusetune {

// Hash/equality that let unordered_map<std::string, ...> be searched with a string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
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

class BpeModel {
 public:
  // `where` names the file in error messages. Throws fusetune::Error when a merge names a
  // token that is not in the vocabulary, or its result is not in the vocabulary.
  BpeModel(StringMap<int32_t> vocab, const std::vector<std::pair<std::string, std::string>>& merges,
           BpeOptions options, const std::string& where);

  // Appends the ids of one pre-tokenized word (valid UTF-8).
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  // nullptr when the id is not in the vocabulary.
  const std::string* id_to_token(int32_t id) const;
  int32_t max_id() const { return int32_t(id_to_token_.size()) - 1; }
  size_t size() const { return vocab_.size(); }
  size_t num_merges() const { return merges_.size(); }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
  }
  void encode_uncached(std::string_view word, std::vector<int32_t>& out) const;
  void initial_symbols(std::string_view word, std::vector<int32_t>& ids) const;
  void merge_short(std::vector<int32_t>& ids) const;
  void merge_long(std::vector<int32_t>& ids) const;
  const Merge* find_merge(int32_t a, int32_t b) const;

  StringMap<int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::unordered_map<uint64_t, Merge> merges_;
  BpeOptions opt_;
  std::optional<int32_t> unk_id_;
  std::array<int32_t, 256> byte_ids_{};  // <0xXX> ids for byte_fallback; -1 when absent
  bool all_bytes_ = false;

  // Bounded word cache, sharded to keep lock contention low when loader threads share one
  // tokenizer. A shard is cleared when it fills.
  static constexpr size_t kShards = 16, kShardCapacity = 8192, kMaxCachedWord = 256;
  struct Shard {
    std::mutex mu;
    StringMap<std::vector<int32_t>> map;
  };
  mutable std::array<Shard, kShards> cache_;
};

}  // namespace fusetune
