// Qwen2 / Qwen2.5 from vocab.json + merges.txt (torchtune's qwen2_tokenizer /
// qwen2_5_tokenizer) on small hand-made files: parsing and its errors, NFC, special tokens
// and their defaults, special_tokens_path, the bos/eos/pad/unk_token keys, decode.
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "checks.h"
#include "fusetune/tokenizers/byte_level.h"
#include "fusetune/tokenizers/load_tokenizer.h"
#include "fusetune/tokenizers/qwen2_tokenizer.h"
#include "fusetune/util/error.h"
#include "test_support.h"

namespace fusetune {
namespace {

using fusetune::testing::contains;
using fusetune::testing::error_of;
using nlohmann::json;

const std::string G = "\xC4\xA0";  // byte-level space

// The 256 byte-level characters (ids 0..255 in byte order), then the merges' results.
std::pair<std::string, std::string> files() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level::encode_byte(static_cast<unsigned char>(b))] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {G, "w"}, {"\xC3\x83", "\xC2\xA9"}};
  std::string m = "#version: 0.2\n";
  int next = 256;
  for (const auto& [a, b] : merges) {
    vocab[a + b] = next++;
    m += a + " " + b + "\n";
  }
  return {vocab.dump(), m};
}
constexpr int32_t kHelloId = 259, kEAcuteId = 261;

std::unique_ptr<HfTokenizer> small_qwen2(Qwen2Options o = {},
                                         const std::vector<SpecialToken>& sp = {}) {
  auto [v, m] = files();
  return qwen2_tokenizer_from_text(v, m, sp, o, "qwen-test");
}

TEST(DataTokenizerQwen2, MergesTxtAndVocabJson) {
  auto tok = small_qwen2();
  EXPECT_EQ(tok->encode("hello", false, false), (std::vector<int32_t>{kHelloId}));
  // Qwen's pattern splits digits one by one.
  EXPECT_EQ(tok->encode("12", false, false), (std::vector<int32_t>{'1', '2'}));
  // NFC first: e + U+0301 is é (C3 A9, byte-level "Ã©").
  EXPECT_EQ(tok->encode("e\xCC\x81", false, false), (std::vector<int32_t>{kEAcuteId}));
  EXPECT_EQ(tok->decode(tok->encode("hello world\n", false, false), false), "hello world\n");
}

TEST(DataTokenizerQwen2, ParseErrorsNameFileAndLine) {
  EXPECT_TRUE(contains(error_of([] { parse_merges_txt("#version: 0.2\na b\nabc\n", "m.txt"); }),
                       "m.txt line 3: expected two tokens separated by one space, got 'abc'"));
  EXPECT_TRUE(contains(error_of([] { parse_merges_txt("a b c\n", "m.txt"); }), "m.txt line 1"));
  EXPECT_EQ(parse_merges_txt("#version: 0.2\r\n\r\na b\r\n", "m.txt").size(), 1u);
  EXPECT_TRUE(
      contains(error_of([] { parse_vocab_json("[1]", "v.json"); }), "must be a JSON object"));
  EXPECT_TRUE(contains(error_of([] { parse_vocab_json(R"({"a": "x"})", "v.json"); }),
                       "token 'a' must map"));
  EXPECT_TRUE(contains(error_of([] { parse_vocab_json("{", "v.json"); }), "is not valid JSON"));
  // Named references, not a structured binding: clang 14 lambdas cannot capture bindings.
  const auto vocab_and_merges = files();
  const std::string& v = vocab_and_merges.first;
  const std::string& m = vocab_and_merges.second;
  EXPECT_TRUE(contains(error_of([&] { qwen2_tokenizer_from_text(R"({"a": 0})", m, {}, {}, "q"); }),
                       "lacks the byte-level token"));
  EXPECT_TRUE(contains(
      error_of([&] { qwen2_tokenizer_from_text(v, "#version: 0.2\nh e\nzz q\n", {}, {}, "q"); }),
      "q (merges.txt) line 3: merge 'zz q': its left token is not in vocab.json"));
  EXPECT_TRUE(contains(error_of([&] { qwen2_tokenizer_from_text(v, "q z\n", {}, {}, "q"); }),
                       "line 1: merge 'q z': the token it makes is not in vocab.json"));
}

TEST(DataTokenizerQwen2, SpecialTokensAndDefaultsAsTorchtune) {
  auto tok = small_qwen2();
  EXPECT_EQ(tok->token_to_id("<|endoftext|>"), 151643);
  EXPECT_EQ(tok->token_to_id("<|im_start|>"), 151644);
  EXPECT_EQ(tok->token_to_id("<|im_end|>"), 151645);
  EXPECT_EQ(tok->token_to_id("<tool_call>"), 151657);
  EXPECT_EQ(tok->token_to_id("<|file_sep|>"), 151664);
  EXPECT_EQ(qwen2_5_special_tokens().size(), 22u);
  EXPECT_EQ(tok->bos_id(), -1);
  EXPECT_EQ(tok->eos_id(), 151645);
  EXPECT_EQ(tok->pad_id(), 151643);
  EXPECT_FALSE(tok->default_add_bos());
  EXPECT_TRUE(tok->default_add_eos());
  EXPECT_EQ(tok->vocab_size(), 151665);
  EXPECT_EQ(tok->encode("<|im_start|>hello<|im_end|>", true, true),
            (std::vector<int32_t>{151644, kHelloId, 151645, 151645}));
  EXPECT_EQ(tok->decode({151644, kHelloId, 151645}, true), "hello");
  EXPECT_EQ(tok->decode({151644, kHelloId, 151645}, false), "<|im_start|>hello<|im_end|>");

  Qwen2Options q2;
  q2.version = QwenVersion::Qwen2;
  auto t2 = small_qwen2(q2);
  EXPECT_EQ(t2->token_to_id("<|im_end|>"), 151645);
  EXPECT_FALSE(t2->token_to_id("<tool_call>"));
  EXPECT_EQ(t2->vocab_size(), 151646);
}

TEST(DataTokenizerQwen2, TokenKeys) {
  Qwen2Options o;
  o.bos_token = "<|im_start|>";
  o.eos_token = "<|endoftext|>";
  o.pad_token = "";  // null: none, so PAD falls back to EOS
  o.unk_token = "<|endoftext|>";
  auto tok = small_qwen2(o);
  EXPECT_EQ(tok->bos_id(), 151644);
  EXPECT_EQ(tok->eos_id(), 151643);
  EXPECT_EQ(tok->pad_id(), 151643);
  Qwen2Options bad;
  bad.eos_token = "</s>";
  EXPECT_TRUE(contains(error_of([&] { small_qwen2(bad); }), "eos_token '</s>' is not one of"));
}

TEST(DataTokenizerQwen2, LoadedByTypeWithMergesFileAndSpecialTokensPath) {
  testing::TempDir dir;
  auto [v, m] = files();
  std::ofstream(dir / "vocab.json") << v;
  std::ofstream(dir / "merges.txt") << m;
  std::ofstream(dir / "special.json") << R"({"added_tokens": [
      {"id": 400, "content": "<|endoftext|>"}, {"id": 401, "content": "<|im_end|>"},
      {"id": 402, "content": "<think>"}]})";
  TokenizerSpec s;
  s.type = "qwen2_5";
  s.path = dir / "vocab.json";
  s.merges_file = dir / "merges.txt";
  auto tok = load_tokenizer(s);
  EXPECT_EQ(tok->encode("hello<|im_end|>", false, false), (std::vector<int32_t>{kHelloId, 151645}));
  s.special_tokens_path = dir / "special.json";
  tok = load_tokenizer(s);
  EXPECT_EQ(tok->encode("hello<think><|im_end|>", false, false),
            (std::vector<int32_t>{kHelloId, 402, 401}));
  EXPECT_FALSE(tok->token_to_id("<|im_start|>"));
  // auto: vocab.json with merges.txt beside it; a directory holding both.
  EXPECT_EQ(load_tokenizer("auto", dir / "vocab.json")->encode("hello", false, false),
            (std::vector<int32_t>{kHelloId}));
  EXPECT_EQ(load_tokenizer("qwen2", dir.path())->encode("hello", false, false),
            (std::vector<int32_t>{kHelloId}));
  // Without merges_file.
  TokenizerSpec nm;
  nm.type = "qwen2_5";
  nm.path = dir / "vocab.json";
  EXPECT_TRUE(contains(error_of([&] { load_tokenizer(nm); }), "needs merges_file"));
  // A tokenizer.json path has its own merges and added tokens.
  std::ofstream(dir / "tokenizer.json")
      << R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})";
  TokenizerSpec tj;
  tj.type = "qwen2_5";
  tj.path = dir / "tokenizer.json";
  EXPECT_EQ(load_tokenizer(tj)->encode("a", false, false), (std::vector<int32_t>{0}));
  tj.merges_file = dir / "merges.txt";
  EXPECT_TRUE(contains(error_of([&] { load_tokenizer(tj); }), "holds its own merges"));
  tj.merges_file.clear();
  tj.special_tokens_path = dir / "special.json";
  EXPECT_TRUE(contains(error_of([&] { load_tokenizer(tj); }), "holds its own added tokens"));
}

}  // namespace
}  // namespace fusetune
