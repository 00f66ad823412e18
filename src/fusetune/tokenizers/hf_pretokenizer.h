#pragma once
// tokenizer.json "pre_tokenizer": Split (regex or literal, all five behaviors, invert),
// ByteLevel, Metaspace, Whitespace, WhitespaceSplit, Digits and Sequence of them.
#include <memory>
#include <string>
#include <vector>

#include "fusetune/tokenizers/hf_json.h"

namespace fusetune {

// One piece of text on its way to the model. at_start: the piece begins at offset 0 of the
// original input (Metaspace's prepend_scheme "first" needs it).
struct PreToken {
  std::string text;
  bool at_start = false;
};

class HfPreTokenizer {
 public:
  virtual ~HfPreTokenizer() = default;
  // Replaces `pieces` by their pre-tokenized pieces; empty pieces are dropped.
  virtual void pre_tokenize(std::vector<PreToken>& pieces) const = 0;
};

// nullptr for a null pre_tokenizer. Throws fusetune::Error for unknown or malformed ones.
std::unique_ptr<HfPreTokenizer> make_hf_pre_tokenizer(const hf_json::Json& j,
                                                      const hf_json::Where& w);

}  // namespace fusetune
