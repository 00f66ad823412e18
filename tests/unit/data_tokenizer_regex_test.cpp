#include <gtest/gtest.h>

#include "fusetune/tokenizers/regex.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

std::vector<std::string> matches(const Regex& re, const std::string& text) {
  std::vector<std::string> out;
  re.find_all(text, [&](size_t b, size_t e) { out.push_back(text.substr(b, e - b)); });
  return out;
}

TEST(DataTokenizerRegex, OnigurumaClassesReplacePcre2s) {
  EXPECT_EQ(Regex::onig_compatible(R"(\s+)"), R"([\t-\r\x{85}\p{Z}]+)");
  EXPECT_EQ(Regex::onig_compatible(R"(\s+(?!\S))"),
            R"([\t-\r\x{85}\p{Z}]+(?![^\t-\r\x{85}\p{Z}]))");
  EXPECT_EQ(Regex::onig_compatible(R"([^\s\p{L}])"), R"([^\t-\r\x{85}\p{Z}\p{L}])");
  EXPECT_EQ(Regex::onig_compatible(R"(\w+|[^\w\s]+)"),
            R"([\p{L}\p{M}\p{N}\p{Pc}]+|[^\p{L}\p{M}\p{N}\p{Pc}\t-\r\x{85}\p{Z}]+)");
  // Escaped backslashes, \Q...\E, POSIX classes, a leading ']' and \S inside a class stay.
  EXPECT_EQ(Regex::onig_compatible(R"(\\s)"), R"(\\s)");
  EXPECT_EQ(Regex::onig_compatible(R"(\Q\s\E\s)"), R"(\Q\s\E[\t-\r\x{85}\p{Z}])");
  EXPECT_EQ(Regex::onig_compatible(R"([[:alpha:]\s])"), R"([[:alpha:]\t-\r\x{85}\p{Z}])");
  EXPECT_EQ(Regex::onig_compatible(R"([]\s])"), R"([]\t-\r\x{85}\p{Z}])");
  EXPECT_EQ(Regex::onig_compatible(R"([\S])"), R"([\S])");
}

TEST(DataTokenizerRegex, WhitespaceIsUnicodeWhiteSpace) {
  Regex re(R"(\s+)", "test");
  // U+180E (Mongolian vowel separator) is not White_Space since Unicode 6.3; U+0085 and
  // U+3000 are.
  EXPECT_EQ(matches(re,
                    "a\xE1\xA0\x8E"
                    "b"),
            std::vector<std::string>{});
  EXPECT_EQ(matches(re,
                    "a\xC2\x85"
                    "b\xE3\x80\x80"
                    "c"),
            (std::vector<std::string>{"\xC2\x85", "\xE3\x80\x80"}));
  Regex word(R"(\w+)", "test");
  // A combining mark continues a word.
  EXPECT_EQ(matches(word, "e\xCC\x81t\xC3\xA9 x"),
            (std::vector<std::string>{"e\xCC\x81t\xC3\xA9", "x"}));
}

TEST(DataTokenizerRegex, EmptyMatchesAdvanceAndBadPatternsAreErrors) {
  Regex re("x*", "test");
  EXPECT_EQ(matches(re, "axxbx"), (std::vector<std::string>{"xx", "x"}));
  try {
    Regex bad("(unclosed", "tokenizer.json pre_tokenizer.pattern");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.json pre_tokenizer.pattern"),
              std::string::npos);
    EXPECT_NE(std::string(e.what()).find("does not compile"), std::string::npos);
  }
  EXPECT_EQ(matches(Regex(Regex::escape("a.b*"), "test"), "a.b* axb"),
            (std::vector<std::string>{"a.b*"}));
}

}  // namespace
}  // namespace fusetune
