#pragma once
// A compiled PCRE2 regex (UTF + Unicode properties, JIT when available) for tokenizer.json
// Split patterns and Replace normalizers, with Oniguruma's meaning of \s and \w (the regex
// engine of Hugging Face tokenizers). Thread-safe: matching state lives per thread.
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace fusetune {

class Regex {
 public:
  // Throws fusetune::Error naming `what` (e.g. "tokenizer.json pre_tokenizer Split pattern")
  // when the pattern does not compile.
  Regex(std::string pattern, const std::string& what);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls on_match(start, end) for each successive non-overlapping, non-empty match in
  // `text` (valid UTF-8), left to right, as Rust's/Oniguruma's find_iter does.
  void find_all(std::string_view text, const std::function<void(size_t, size_t)>& on_match) const;

  const std::string& pattern() const { return pattern_; }

  // A pattern matching `literal` exactly (for {"String": ...} patterns).
  static std::string escape(std::string_view literal);

  // Rewrites \s \S \w \W to Oniguruma's Unicode definitions, which PCRE2's differ from:
  // \s = U+0009..U+000D, U+0085 and \p{Z} (PCRE2 adds U+180E), \w = \p{L} \p{M} \p{N}
  // \p{Pc} (PCRE2 10.42 lacks marks). \S and \W inside a character class stay PCRE2's.
  static std::string onig_compatible(std::string_view pattern);

 private:
  struct Impl;
  std::string pattern_;
  std::unique_ptr<Impl> impl_;
};

// Replaces each match of `re` (or, when `re` is null, each occurrence of a non-empty
// `literal`) in `text` with `content`: Hugging Face's Replace normalizer and decoder.
void replace_matches(std::string& text, const std::string& literal, const Regex* re,
                     const std::string& content);

}  // namespace fusetune
