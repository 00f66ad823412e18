#include <gtest/gtest.h>

#include "fusetune/tokenizers/byte_level.h"
#include "fusetune/tokenizers/unicode_normalize.h"
#include "fusetune/tokenizers/utf8.h"

namespace fusetune {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

TEST(DataTokenizerUtf8, ValidityFollowsUnicodeTable) {
  EXPECT_TRUE(utf8::is_valid(""));
  EXPECT_TRUE(utf8::is_valid("plain ascii"));
  EXPECT_TRUE(utf8::is_valid("caf\xC3\xA9 \xE4\xB8\xAD \xF0\x9F\x98\x80"));
  EXPECT_FALSE(utf8::is_valid("\xC0\xAF"));          // overlong
  EXPECT_FALSE(utf8::is_valid("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(utf8::is_valid("\xF4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(utf8::is_valid("\xE2\x82"));          // truncated
  EXPECT_FALSE(utf8::is_valid("\x80"));              // stray continuation
}

// Same results as Python's bytes.decode("utf-8", "replace") / Rust's from_utf8_lossy.
TEST(DataTokenizerUtf8, LossyReplacesMaximalSubparts) {
  EXPECT_EQ(utf8::to_valid_lossy("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64"),
            "a" + kFffd + kFffd + kFffd + "b" + kFffd + "c" + kFffd + kFffd + "d");
  EXPECT_EQ(utf8::to_valid_lossy("\xE0\x80\xAF"), kFffd + kFffd + kFffd);
  EXPECT_EQ(utf8::to_valid_lossy("\xED\xA0\x80x"), kFffd + kFffd + kFffd + "x");
  EXPECT_EQ(utf8::to_valid_lossy("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);
  EXPECT_EQ(utf8::to_valid_lossy("\xC3"), kFffd);
  EXPECT_EQ(utf8::to_valid_lossy("\xE2\x82"), kFffd);
  EXPECT_EQ(utf8::to_valid_lossy("ok\xFF"), "ok" + kFffd);
  EXPECT_EQ(utf8::to_valid_lossy("caf\xC3\xA9"), "caf\xC3\xA9");
}

TEST(DataTokenizerUtf8, NextPrevAppendRoundTrip) {
  const std::string s = "a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80";
  std::vector<char32_t> cps;
  for (size_t i = 0; i < s.size();) cps.push_back(utf8::next(s, i));
  EXPECT_EQ(cps, (std::vector<char32_t>{'a', 0xE9, 0x4E2D, 0x1F600}));
  std::string back;
  for (char32_t c : cps) utf8::append(back, c);
  EXPECT_EQ(back, s);
  size_t start;
  EXPECT_EQ(utf8::prev(s, s.size(), start), char32_t(0x1F600));
  EXPECT_EQ(start, s.size() - 4);
}

TEST(DataTokenizerUtf8, ByteLevelAlphabetIsGpt2s) {
  EXPECT_EQ(byte_level::encode_byte(' '), "\xC4\xA0");   // U+0120 'Ġ'
  EXPECT_EQ(byte_level::encode_byte('\n'), "\xC4\x8A");  // U+010A 'Ċ'
  EXPECT_EQ(byte_level::encode_byte('a'), "a");
  for (int b = 0; b < 256; ++b) {
    const std::string& e = byte_level::encode_byte(static_cast<unsigned char>(b));
    size_t i = 0;
    EXPECT_EQ(byte_level::decode_char(utf8::next(e, i)), b);
  }
  EXPECT_EQ(byte_level::decode_char(0x4E2D), -1);
}

TEST(DataTokenizerUtf8, NormalizationUsesUnicodeData) {
  EXPECT_EQ(unicode::normalize("e\xCC\x81", unicode::NormalForm::NFC), "\xC3\xA9");
  EXPECT_EQ(unicode::normalize("\xC3\xA9", unicode::NormalForm::NFD), "e\xCC\x81");
  EXPECT_EQ(unicode::normalize("\xE2\x84\xAB", unicode::NormalForm::NFC), "\xC3\x85");  // Å sign
  EXPECT_EQ(unicode::normalize("\xEF\xAC\x81", unicode::NormalForm::NFKC), "fi");
  EXPECT_EQ(unicode::normalize("\xEF\xAC\x81", unicode::NormalForm::NFC), "\xEF\xAC\x81");
  // Conjoining jamo compose to a Hangul syllable.
  EXPECT_EQ(unicode::normalize("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8", unicode::NormalForm::NFC),
            "\xEA\xB0\x81");
  EXPECT_EQ(unicode::to_lower("ABC \xC3\x89"), "abc \xC3\xA9");
  EXPECT_TRUE(unicode::is_whitespace(0x3000));
  EXPECT_TRUE(unicode::is_whitespace(0x85));
  EXPECT_FALSE(unicode::is_whitespace(0xFEFF));
  EXPECT_FALSE(unicode::is_whitespace(0x200B));
}

}  // namespace
}  // namespace fusetune
