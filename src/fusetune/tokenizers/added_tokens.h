#pragma once
// Added (and special) tokens of a tokenizer.json, found in the input text before the model
// sees it: leftmost-longest matching with a byte trie, honoring lstrip / rstrip / single_word.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fusetune {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool lstrip = false, rstrip = false, single_word = false;
  bool normalized = false;  // matched in normalized text rather than in the raw input
};

class AddedTokenMatcher {
 public:
  struct Segment {
    size_t begin, end;  // byte range of the input
    int32_t id;         // the added token's id, or -1 for plain text
  };

  AddedTokenMatcher() = default;
  // `patterns[k]` is matched for `tokens[k]` (patterns may differ from content once
  // normalized). Empty patterns are ignored.
  AddedTokenMatcher(const std::vector<AddedToken>& tokens,
                    const std::vector<std::string>& patterns);

  bool empty() const { return nodes_.size() <= 1; }

  // Tiles `text` (valid UTF-8) into plain-text segments and added-token segments. Plain
  // segments are never empty. Appends to `out`.
  void split(std::string_view text, std::vector<Segment>& out) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int>> kids;  // sorted by byte
    int token = -1;                                   // index into tokens_, or -1
  };
  int child(int node, unsigned char c) const;

  std::vector<AddedToken> tokens_;
  std::vector<Node> nodes_{1};
  bool first_byte_[256] = {};
  int only_first_byte_ = -1;  // the first byte every token shares ('<' in Llama 3), or -1
};

}  // namespace fusetune
