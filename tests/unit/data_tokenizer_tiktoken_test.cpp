// tiktoken tokenizer.model files (Llama 3) on small hand-made files: the "<base64> <rank>"
// format and its errors, BPE by ranks against a naive transcription of tiktoken's merge loop,
// the Llama 3 special tokens as torchtune defines them, special_tokens_path, decode.
#include <fstream>
#include <map>
#include <random>

#include <gtest/gtest.h>

#include "checks.h"
#include "fusetune/tokenizers/load_tokenizer.h"
#include "fusetune/tokenizers/tiktoken_tokenizer.h"
#include "fusetune/util/error.h"
#include "test_support.h"

using fusetune::testing::contains;
using fusetune::testing::error_of;

namespace fusetune {
namespace {

std::string b64(const std::string& bytes) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    uint32_t v = (uint32_t(uint8_t(bytes[i])) << 16) | (uint32_t(uint8_t(bytes[i + 1])) << 8) |
                 uint8_t(bytes[i + 2]);
    for (int k2 = 0; k2 < 4; ++k2) out += k[(v >> (18 - 6 * k2)) & 63];
  }
  if (bytes.size() - i == 1) {
    uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
    out += k[(v >> 18) & 63];
    out += k[(v >> 12) & 63];
    out += "==";
  } else if (bytes.size() - i == 2) {
    uint32_t v = (uint32_t(uint8_t(bytes[i])) << 16) | (uint32_t(uint8_t(bytes[i + 1])) << 8);
    out += k[(v >> 18) & 63];
    out += k[(v >> 12) & 63];
    out += k[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

// The 256 bytes at ranks 0..255, then `extra` tokens at 256, 257, ...
std::string tiktoken_text(const std::vector<std::string>& extra) {
  std::string t;
  for (int b = 0; b < 256; ++b) t += b64(std::string(1, char(b))) + " " + std::to_string(b) + "\n";
  for (size_t i = 0; i < extra.size(); ++i)
    t += b64(extra[i]) + " " + std::to_string(256 + i) + "\n";
  return t;
}

const std::vector<std::string> kExtra = {"he", "ll",   "llo", "hello",  " w",
                                         "or", " wor", "ld",  " world", "aa"};
constexpr int32_t kHe = 256, kHello = 259, kWorld = 264, kAa = 265;

std::unique_ptr<HfTokenizer> small(const std::vector<SpecialToken>& specials = {}) {
  return llama3_tiktoken_from_text(tiktoken_text(kExtra), specials, "test.model");
}

TEST(DataTokenizerTiktoken, ParsesBase64AndRanks) {
  auto e = parse_tiktoken("aGk= 7\n\nIQ== 3\r\n", "f");
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].bytes, "hi");
  EXPECT_EQ(e[0].rank, 7);
  EXPECT_EQ(e[1].bytes, "!");
  EXPECT_EQ(e[1].rank, 3);
  EXPECT_EQ(parse_tiktoken("YWJj 0\n", "f")[0].bytes, "abc");  // no padding
}

TEST(DataTokenizerTiktoken, MalformedLinesNameFileAndLine) {
  EXPECT_TRUE(contains(error_of([] { parse_tiktoken("aGk= 1\naGk 2 3\n", "m.model"); }),
                       "m.model line 2: expected '<base64 token> <rank>'"));
  EXPECT_TRUE(contains(error_of([] { parse_tiktoken("aGk= 1\n\n!!!! 2\n", "m.model"); }),
                       "m.model line 3: '!!!!' is not a base64 token"));
  EXPECT_TRUE(contains(error_of([] { parse_tiktoken("aGk= x1\n", "m.model"); }),
                       "m.model line 1: rank 'x1' is not a non-negative integer"));
  EXPECT_TRUE(contains(error_of([] { parse_tiktoken("aGk= -1\n", "m.model"); }), "line 1: rank"));
  EXPECT_TRUE(
      contains(error_of([] { parse_tiktoken("aGk= 99999999999\n", "m.model"); }), "below 2^30"));
  EXPECT_TRUE(contains(error_of([] { parse_tiktoken("aGk= 1\nIQ== 1\n", "m.model"); }),
                       "line 2: rank 1 repeats line 1"));
  EXPECT_TRUE(contains(error_of([] { parse_tiktoken("aGk= 1\naGk= 2\n", "m.model"); }),
                       "line 2: token aGk= repeats line 1"));
  EXPECT_TRUE(contains(error_of([] { parse_tiktoken("\n\n", "m.model"); }), "holds no tokens"));
  // A SentencePiece protobuf read as tiktoken: the first line's error says what to do.
  EXPECT_TRUE(contains(error_of([] { parse_tiktoken("\x08\x05<unk>\x15 x y\n", "m.model"); }),
                       "SentencePiece"));
  // Every byte needs a rank.
  std::string missing = tiktoken_text({});
  missing.erase(missing.find(b64("A") + " 65\n"), b64("A").size() + 4);
  EXPECT_TRUE(contains(error_of([&] { llama3_tiktoken_from_text(missing, {}, "m.model"); }),
                       "no token for the single byte 0x41"));
}

TEST(DataTokenizerTiktoken, MergesByRank) {
  auto tok = small();
  EXPECT_EQ(tok->encode("hello world", false, false), (std::vector<int32_t>{kHello, kWorld}));
  // "hellooo" is not a token: h e l l o o o -> he, ll, llo, hello, then o o (no "oo").
  EXPECT_EQ(tok->encode("hellooo", false, false), (std::vector<int32_t>{kHello, 'o', 'o'}));
  EXPECT_EQ(tok->encode("aaa", false, false), (std::vector<int32_t>{kAa, 'a'}));  // leftmost
  EXPECT_EQ(tok->encode("hex", false, false), (std::vector<int32_t>{kHe, 'x'}));
  // Non-ASCII text: its UTF-8 bytes, each a token.
  EXPECT_EQ(tok->encode("\xC3\xA9", false, false), (std::vector<int32_t>{0xC3, 0xA9}));
}

// tiktoken's _byte_pair_merge transcribed naively: a piece that is a token is taken whole;
// otherwise start from bytes and merge the adjacent pair whose concatenation has the lowest
// rank, the leftmost among equals, until no pair is a token.
std::vector<int32_t> naive_tiktoken(const std::map<std::string, int32_t>& ranks,
                                    const std::string& piece) {
  if (auto it = ranks.find(piece); it != ranks.end()) return {it->second};
  std::vector<std::string> parts;
  for (char c : piece) parts.emplace_back(1, c);
  while (parts.size() > 1) {
    size_t best = parts.size();
    int32_t best_rank = INT32_MAX;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      auto it = ranks.find(parts[i] + parts[i + 1]);
      if (it != ranks.end() && it->second < best_rank) {
        best_rank = it->second;
        best = i;
      }
    }
    if (best == parts.size()) break;
    parts[best] += parts[best + 1];
    parts.erase(parts.begin() + long(best) + 1);
  }
  std::vector<int32_t> ids;
  for (const auto& p : parts) ids.push_back(ranks.at(p));
  return ids;
}

TEST(DataTokenizerTiktoken, EqualsTiktokensMergeLoopOnRandomVocabularies) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    // Tokens: every string over {a, b, c} of length 2..5 kept with probability 1/2, ranked
    // in a random order after the 256 bytes (so long tokens may outrank their parts).
    std::vector<std::string> extra;
    std::vector<std::string> frontier = {"a", "b", "c"};
    for (int len = 2; len <= 5; ++len) {
      std::vector<std::string> next;
      for (const auto& s : frontier)
        for (char c : std::string("abc")) next.push_back(s + c);
      for (const auto& s : next)
        if (rng() % 2) extra.push_back(s);
      frontier = next;
    }
    std::shuffle(extra.begin(), extra.end(), rng);
    std::map<std::string, int32_t> ranks;
    for (int b = 0; b < 256; ++b) ranks[std::string(1, char(b))] = b;
    for (size_t i = 0; i < extra.size(); ++i) ranks[extra[i]] = int32_t(256 + i);
    auto tok = llama3_tiktoken_from_text(tiktoken_text(extra), {}, "random.model");
    for (int k = 0; k < 200; ++k) {
      std::string word;
      const int n = 1 + int(rng() % 16);
      for (int i = 0; i < n; ++i) word += "abc"[rng() % 3];
      ASSERT_EQ(tok->encode(word, false, false), naive_tiktoken(ranks, word))
          << "trial " << trial << " word " << word;
    }
  }
}

TEST(DataTokenizerTiktoken, Llama3SpecialTokensAsTorchtune) {
  const auto table = llama3_special_tokens();
  ASSERT_EQ(table.size(), 256u);
  std::vector<bool> seen(256, false);
  for (const auto& t : table) {
    ASSERT_GE(t.id, 128000);
    ASSERT_LT(t.id, 128256);
    EXPECT_FALSE(seen[t.id - 128000]) << t.content;
    seen[t.id - 128000] = true;
  }
  auto tok = small();
  const std::vector<std::pair<const char*, int32_t>> named = {
      {"<|begin_of_text|>", 128000},
      {"<|end_of_text|>", 128001},
      {"<|reserved_special_token_0|>", 128002},
      {"<|reserved_special_token_1|>", 128003},
      {"<|finetune_right_pad_id|>", 128004},
      {"<|step_id|>", 128005},
      {"<|start_header_id|>", 128006},
      {"<|end_header_id|>", 128007},
      {"<|eom_id|>", 128008},
      {"<|eot_id|>", 128009},
      {"<|python_tag|>", 128010},
      {"<|reserved_special_token_245|>", 128011},
      {"<|video|>", 128012},
      {"<|reserved_special_token_2|>", 128013},
      {"<|reserved_special_token_100|>", 128111},
      {"<|reserved_special_token_244|>", 128255}};
  for (const auto& [text, id] : named) EXPECT_EQ(tok->token_to_id(text), id) << text;
  // <|image|> (torchtune: 128256, Llama 3.2 Vision) is outside the text models' vocabulary.
  EXPECT_FALSE(tok->token_to_id("<|image|>"));
  EXPECT_FALSE(tok->token_to_id("<|reserved_special_token_246|>"));
  EXPECT_EQ(tok->vocab_size(), 128256);
  EXPECT_EQ(tok->bos_id(), 128000);
  EXPECT_EQ(tok->eos_id(), 128001);
  EXPECT_EQ(tok->pad_id(), 128004);
  EXPECT_TRUE(tok->default_add_bos());
  EXPECT_TRUE(tok->default_add_eos());
  EXPECT_EQ(tok->encode("<|start_header_id|>hello<|end_header_id|>", true, true),
            (std::vector<int32_t>{128000, 128006, kHello, 128007, 128001}));
  EXPECT_EQ(tok->encode("<|image|>", false, false).size(), 9u);  // plain text: < | image | >
}

TEST(DataTokenizerTiktoken, SpecialTokensPathReplacesTheTable) {
  testing::TempDir dir;
  std::ofstream(dir / "tokenizer.model") << tiktoken_text(kExtra);
  std::ofstream(dir / "special.json")
      << R"({"added_tokens": [{"id": 300, "content": "<|begin_of_text|>", "special": true},
                              {"id": 301, "content": "<|end_of_text|>"},
                              {"id": 302, "content": "<|mine|>"}]})";
  TokenizerSpec spec;
  spec.type = "llama3";
  spec.path = dir / "tokenizer.model";
  spec.special_tokens_path = dir / "special.json";
  auto tok = load_tokenizer(spec);
  EXPECT_EQ(tok->encode("hello<|mine|>", true, false), (std::vector<int32_t>{300, kHello, 302}));
  EXPECT_FALSE(tok->token_to_id("<|eot_id|>"));
  EXPECT_EQ(tok->eos_id(), 301);
  EXPECT_EQ(tok->pad_id(), 301);  // no <|finetune_right_pad_id|>: EOS
  EXPECT_EQ(tok->vocab_size(), 303);

  std::ofstream(dir / "nobos.json")
      << R"({"added_tokens": [{"id": 301, "content": "<|end_of_text|>"}]})";
  spec.special_tokens_path = dir / "nobos.json";
  EXPECT_TRUE(contains(
      error_of([&] { load_tokenizer(spec); }),
      "special_tokens_path " + (dir / "nobos.json").string() + " has no <|begin_of_text|>"));
  std::ofstream(dir / "clash.json") << R"({"added_tokens": [
      {"id": 300, "content": "<|begin_of_text|>"}, {"id": 259, "content": "<|end_of_text|>"}]})";
  spec.special_tokens_path = dir / "clash.json";
  EXPECT_TRUE(contains(error_of([&] { load_tokenizer(spec); }),
                       "has id 259, which the vocabulary already gives to another token"));
  std::ofstream(dir / "bad.json") << R"({"added_tokens": [{"content": "<|x|>"}]})";
  spec.special_tokens_path = dir / "bad.json";
  EXPECT_TRUE(
      contains(error_of([&] { load_tokenizer(spec); }), "added_tokens[0] needs an integer \"id\""));
  std::ofstream(dir / "none.json") << R"({"model": {}})";
  spec.special_tokens_path = dir / "none.json";
  EXPECT_TRUE(contains(error_of([&] { load_tokenizer(spec); }), "has no \"added_tokens\" list"));
}

TEST(DataTokenizerTiktoken, DecodeRoundTrips) {
  auto tok = small();
  for (const std::string s : {"hello world", "hellooo\n\n  x", "caf\xC3\xA9 \xE2\x82\xAC 12345",
                              "<|eot_id|>after<|begin_of_text|>", ""}) {
    auto ids = tok->encode(s, false, false);
    EXPECT_EQ(tok->decode(ids, false), s);
  }
  auto ids = tok->encode("<|begin_of_text|>hello<|eot_id|>", false, false);
  EXPECT_EQ(tok->decode(ids, true), "hello");
}

TEST(DataTokenizerTiktoken, ChosenByTypeAndByContent) {
  testing::TempDir dir;
  std::filesystem::create_directories(dir / "original");
  std::ofstream(dir / "original" / "tokenizer.model") << tiktoken_text(kExtra);
  for (const auto& [type, path] : std::vector<std::pair<std::string, std::filesystem::path>>{
           {"llama3", dir / "original" / "tokenizer.model"},
           {"llama3", dir.path()},
           {"auto", dir / "original" / "tokenizer.model"},
           {"auto", dir.path()}}) {
    auto tok = load_tokenizer(type, path);
    EXPECT_EQ(tok->encode("hello", true, false), (std::vector<int32_t>{128000, kHello}))
        << type << " " << path;
  }
  // The sentencepiece type on a tiktoken file says which component reads it.
  for (const auto& p : {dir / "original", dir / "original" / "tokenizer.model"})
    EXPECT_TRUE(contains(error_of([&] { load_tokenizer("sentencepiece", p); }),
                         "is a tiktoken file (Llama 3's original/tokenizer.model)"));
  std::ofstream(dir / "spm.model") << std::string("\x0a\x05<unk>\x15\x00\x00\x00\x00", 11);
  EXPECT_TRUE(contains(error_of([&] { load_tokenizer("llama3", dir / "spm.model"); }),
                       "is not a tiktoken file"));
  TokenizerSpec spec;
  spec.type = "llama3";
  spec.path = dir / "original" / "tokenizer.model";
  spec.merges_file = dir / "merges.txt";
  EXPECT_TRUE(contains(error_of([&] { load_tokenizer(spec); }), "merges_file is not a key"));
}

}  // namespace
}  // namespace fusetune
