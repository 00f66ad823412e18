#pragma once
// tokenizer.json "normalizer": NFC/NFD/NFKC/NFKD, Lowercase, Prepend, Replace, Strip,
// StripAccents and Sequence of them.
#include <memory>
#include <string>

#include "fusetune/tokenizers/hf_json.h"

namespace fusetune {

class HfNormalizer {
 public:
  virtual ~HfNormalizer() = default;
  virtual void normalize(std::string& text) const = 0;  // valid UTF-8 in and out
};

class Regex;

// Reads a tokenizer.json pattern, {"String": s} or {"Regex": r}: returns the compiled regex, or
// nullptr and sets `literal` for a String pattern. Shared by normalizers, pre-tokenizers and
// decoders.
std::unique_ptr<Regex> read_hf_pattern(const hf_json::Json& j, const hf_json::Where& w,
                                       std::string& literal);

// nullptr for a null normalizer. Throws fusetune::Error for unknown or malformed ones.
std::unique_ptr<HfNormalizer> make_hf_normalizer(const hf_json::Json& j, const hf_json::Where& w);

}  // namespace fusetune
