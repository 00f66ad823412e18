#pragma once
// Unicode normalization forms and character properties for tokenizer.json normalizers, through
// ICU (the same Unicode data the rest of the system uses; no hand-made tables).
#include <string>
#include <string_view>

namespace fusetune::unicode {

enum class NormalForm { NFC, NFD, NFKC, NFKD };

// Normalizes valid UTF-8 text. ASCII-only text is returned as is (it is already normal).
std::string normalize(std::string_view utf8, NormalForm form);

// Full Unicode lowercase mapping (root locale), like Rust's str::to_lowercase.
std::string to_lower(std::string_view utf8);

// Unicode White_Space property, like Rust's char::is_whitespace.
bool is_whitespace(char32_t cp);
// Alphabetic or numeric, like Rust's char::is_alphanumeric.
bool is_alphanumeric(char32_t cp);
// General category M (Mn, Mc, Me): what StripAccents removes, as tokenizers does.
bool is_combining_mark(char32_t cp);

}  // namespace fusetune::unicode
