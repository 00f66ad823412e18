#pragma once
// UTF-8 helpers for the tokenizers: validation with the replacement policy of Rust's
// String::from_utf8_lossy (what Hugging Face tokenizers uses when decoding), code point
// iteration and encoding.
#include <cstdint>
#include <string>
#include <string_view>

namespace fusetune::utf8 {

// Length of the well-formed UTF-8 sequence starting at s[i], or 0 when it is ill-formed.
size_t valid_prefix_len(std::string_view s, size_t i);

bool is_valid(std::string_view s);

// Replaces every maximal ill-formed subsequence with U+FFFD (the Unicode "substitution of
// maximal subparts" policy, as Rust's from_utf8_lossy and Python's errors="replace" do).
std::string to_valid_lossy(std::string_view s);

// Decodes the code point at s[i] of a valid UTF-8 string and advances i past it.
inline char32_t next(std::string_view s, size_t& i) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    ++i;
    return c;
  }
  if (c < 0xE0) {
    char32_t cp = ((c & 0x1F) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3F);
    i += 2;
    return cp;
  }
  if (c < 0xF0) {
    char32_t cp = ((c & 0x0F) << 12) | ((static_cast<unsigned char>(s[i + 1]) & 0x3F) << 6) |
                  (static_cast<unsigned char>(s[i + 2]) & 0x3F);
    i += 3;
    return cp;
  }
  char32_t cp = ((c & 0x07) << 18) | ((static_cast<unsigned char>(s[i + 1]) & 0x3F) << 12) |
                ((static_cast<unsigned char>(s[i + 2]) & 0x3F) << 6) |
                (static_cast<unsigned char>(s[i + 3]) & 0x3F);
  i += 4;
  return cp;
}

// Byte length of the (valid) sequence whose lead byte is c.
inline size_t seq_len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

// The code point that ends at s[end) of a valid UTF-8 string; start receives its offset.
char32_t prev(std::string_view s, size_t end, size_t& start);

void append(std::string& out, char32_t cp);

}  // namespace fusetune::utf8
