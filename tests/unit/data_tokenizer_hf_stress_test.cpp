// HfTokenizer under load: long inputs (regex backtracking, the heap merge path, uncached
// words) and many threads sharing one tokenizer (the word cache).
#include <random>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fusetune/tokenizers/byte_level.h"
#include "fusetune/tokenizers/hf_tokenizer.h"
#include "fusetune/tokenizers/utf8.h"

namespace fusetune {
namespace {

using nlohmann::json;

// GPT-2-like: ByteLevel with the GPT-2 regex, a few merges.
std::unique_ptr<HfTokenizer> gpt2_like() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level::encode_byte(static_cast<unsigned char>(b))] = b;
  json merges = json::array();
  int next = 256;
  for (const auto& [a, b] : std::vector<std::pair<std::string, std::string>>{
           {"\xC4\xA0", "\xC4\xA0"}, {"a", "b"}, {"ab", "ab"}, {"\xC4\xA0", "a"}, {"c", "c"}}) {
    vocab[a + b] = next++;
    merges.push_back(a + " " + b);
  }
  json t = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
            {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
            {"decoder", {{"type", "ByteLevel"}}}};
  return HfTokenizer::from_json(t.dump());
}

std::string random_text(std::mt19937& rng, size_t n) {
  static const std::vector<std::string> pool = {
      "a",  "b",  "c",       " ",        "  ",           "\n",
      "ab", "'s", "1",       "\xC3\xA9", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80",
      "!",  "\t", "\xC2\xA0"};
  std::string s;
  while (s.size() < n) s += pool[rng() % pool.size()];
  return s;
}

TEST(DataTokenizerHfStress, LongInputsRoundTrip) {
  auto tok = gpt2_like();
  const std::vector<std::string> inputs = {
      std::string(300000, ' '),            // \s+(?!\S) over a long run
      std::string(300000, ' ') + "x",      // ... that must backtrack one character
      std::string(200000, '\n') + "  \t",  // \s*[\r\n]+-style runs
      std::string(100000, 'a'),            // one long uncached word
      [] {
        std::string s;
        for (int i = 0; i < 50000; ++i) s += "ab";
        return s;
      }(),
      [] {
        std::string s;
        for (int i = 0; i < 30000; ++i) s += "\xE4\xB8\xAD";
        return s;
      }(),
      std::string(100000, '!'),
  };
  for (const auto& s : inputs) {
    auto ids = tok->encode(s, false, false);
    EXPECT_FALSE(ids.empty());
    EXPECT_EQ(tok->decode(ids, false), s) << "length " << s.size();
  }
}

TEST(DataTokenizerHfStress, LongWordWithoutPreTokenizerUsesHeapPath) {
  // No pre-tokenizer: the whole text is one word for the BPE (SentencePiece-style files).
  json t = {{"model",
             {{"type", "BPE"},
              {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}, {"abab", 3}}},
              {"merges", {"a b", "ab ab"}}}}};
  auto tok = HfTokenizer::from_json(t.dump());
  std::string s;
  for (int i = 0; i < 100000; ++i) s += "ab";
  auto ids = tok->encode(s, false, false);
  ASSERT_EQ(ids.size(), 50000u);
  for (int32_t id : ids) ASSERT_EQ(id, 3);
}

TEST(DataTokenizerHfStress, ThreadsSharingOneTokenizerAgree) {
  auto tok = gpt2_like();
  std::mt19937 rng(11);
  std::vector<std::string> texts;
  for (int i = 0; i < 400; ++i) texts.push_back(random_text(rng, 1 + rng() % 300));
  std::vector<std::vector<int32_t>> want;
  {
    auto fresh = gpt2_like();  // computed on a separate instance: its cache is independent
    for (const auto& t : texts) want.push_back(fresh->encode(t, false, false));
  }
  std::vector<std::thread> threads;
  std::vector<int> mismatches(6, 0);
  for (int th = 0; th < 6; ++th) {
    threads.emplace_back([&, th] {
      for (int rep = 0; rep < 3; ++rep)
        for (size_t i = 0; i < texts.size(); ++i) {
          size_t k = (i * 7 + size_t(th) * 13) % texts.size();
          if (tok->encode(texts[k], false, false) != want[k]) ++mismatches[th];
        }
    });
  }
  for (auto& t : threads) t.join();
  for (int th = 0; th < 6; ++th) EXPECT_EQ(mismatches[th], 0) << "thread " << th;
}

TEST(DataTokenizerHfStress, RandomBytesNeverCrash) {
  auto tok = gpt2_like();
  std::mt19937 rng(5);
  for (int i = 0; i < 500; ++i) {
    std::string s(rng() % 64, '\0');
    for (char& c : s) c = char(rng());
    // Invalid UTF-8 is read as U+FFFD; everything else comes back exactly.
    EXPECT_EQ(tok->decode(tok->encode(s, true, true), false), utf8::to_valid_lossy(s));
  }
  std::vector<int32_t> garbage;
  for (int i = 0; i < 1000; ++i) garbage.push_back(int32_t(rng()));
  EXPECT_NO_THROW(tok->decode(garbage, false));
  EXPECT_NO_THROW(tok->decode(garbage, true));
}

}  // namespace
}  // namespace fusetune
