#pragma once
// GPT-2's byte-level alphabet: each byte maps to one printable code point, so any byte string
// becomes a string of vocabulary characters (space -> 'Ġ', newline -> 'Ċ').
#include <array>
#include <string>
#include <string_view>

namespace fusetune::byte_level {

// UTF-8 of the code point byte b maps to.
const std::string& encode_byte(unsigned char b);

// Appends the byte-level form of `bytes` to out.
void encode(std::string_view bytes, std::string& out);

// The byte a code point stands for, or -1 when the code point is not in the alphabet.
int decode_char(char32_t cp);

}  // namespace fusetune::byte_level
