// HfTokenizer on tiny tokenizer.json files the tests write themselves: byte-level BPE
// (GPT-2 / Llama 3 style) and SentencePiece-style BPE with byte fallback (Llama 2 style).
#include <algorithm>
#include <fstream>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fusetune/tokenizers/byte_level.h"
#include "fusetune/tokenizers/hf_tokenizer.h"
#include "fusetune/util/error.h"
#include "test_support.h"

namespace fusetune {
namespace {

using nlohmann::json;

// --- byte-level BPE ---------------------------------------------------------------------

// byte_level_tokenizer()'s model has 263 entries; its added tokens take the next ids, as
// tokenizers assigns them (the JSON "id" fields agree).
constexpr int32_t kEnd = 263, kEndOfText = 264, kNote = 265;

// Vocabulary: the 256 byte-level characters (ids 0..255 in byte order), then merge results.
json byte_level_tokenizer(bool ignore_merges = false, bool merges_as_arrays = false) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level::encode_byte(static_cast<unsigned char>(b))] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"\xC4\xA0", "t"}, {"h", "e"},  {"\xC4\xA0t", "he"},
      {"l", "l"},        {"ll", "o"}, {"\xC4\xA0", "he"}};
  int next = 256;
  json m = json::array();
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = next++;
    m.push_back(merges_as_arrays ? json::array({a, b}) : json(a + " " + b));
  }
  vocab["\xC4\xA0hello"] = next++;  // reachable only through ignore_merges
  json t;
  t["version"] = "1.0";
  t["added_tokens"] = json::array(
      {{{"id", kEnd}, {"content", "<|end|>"}, {"special", true}, {"normalized", false}},
       {{"id", kEndOfText}, {"content", "<|endoftext|>"}, {"special", true}, {"normalized", false}},
       {{"id", kNote}, {"content", "[note]"}, {"special", false}, {"normalized", true}}});
  t["normalizer"] = nullptr;
  t["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  t["post_processor"] = {{"type", "ByteLevel"}};
  t["decoder"] = {{"type", "ByteLevel"}};
  t["model"] = {{"type", "BPE"},          {"vocab", vocab},       {"merges", m},
                {"byte_fallback", false}, {"unk_token", nullptr}, {"ignore_merges", ignore_merges}};
  return t;
}

std::unique_ptr<HfTokenizer> load(const json& t, const json& cfg = json()) {
  return HfTokenizer::from_json(t.dump(), cfg.is_null() ? "" : cfg.dump(), "test tokenizer.json");
}

std::vector<int32_t> ids_of(const HfTokenizer& tok, std::initializer_list<const char*> tokens) {
  std::vector<int32_t> out;
  for (const char* t : tokens) {
    auto id = tok.token_to_id(t);
    EXPECT_TRUE(id) << "no token " << t;
    out.push_back(id.value_or(-1));
  }
  return out;
}

TEST(DataTokenizerHf, ByteLevelMergesByRank) {
  auto tok = load(byte_level_tokenizer());
  // "the" (no leading space) has no "t he" merge; " hello": he, ll, llo, then Ġ+he by rank.
  EXPECT_EQ(tok->encode("the", false, false), ids_of(*tok, {"t", "he"}));
  EXPECT_EQ(tok->encode(" the", false, false), ids_of(*tok, {"\xC4\xA0the"}));
  EXPECT_EQ(tok->encode(" hello", false, false), ids_of(*tok, {"\xC4\xA0he", "llo"}));
  EXPECT_EQ(tok->encode("", false, false), std::vector<int32_t>{});
  // Bytes outside ASCII come through the byte-level alphabet.
  EXPECT_EQ(tok->encode("\xC3\xA9", false, false), (std::vector<int32_t>{0xC3, 0xA9}));
}

TEST(DataTokenizerHf, MergesAsArraysEqualMergesAsStrings) {
  auto a = load(byte_level_tokenizer(false, false));
  auto b = load(byte_level_tokenizer(false, true));
  for (const char* s : {"the hello there", " hello\nthe", "hehehe llll"})
    EXPECT_EQ(a->encode(s, false, false), b->encode(s, false, false)) << s;
}

TEST(DataTokenizerHf, IgnoreMergesTakesWholeWordFromVocab) {
  auto plain = load(byte_level_tokenizer(false));
  auto llama3 = load(byte_level_tokenizer(true));
  EXPECT_EQ(plain->encode(" hello", false, false), ids_of(*plain, {"\xC4\xA0he", "llo"}));
  EXPECT_EQ(llama3->encode(" hello", false, false), ids_of(*llama3, {"\xC4\xA0hello"}));
}

TEST(DataTokenizerHf, ByteLevelDecodeRoundTrips) {
  auto tok = load(byte_level_tokenizer());
  for (const char* s : {"the hello", "  spaces\n\ttabs\r\n",
                        "caf\xC3\xA9 \xE4\xB8\xAD\xF0\x9F\x98\x80", "x<|end|>y", ""}) {
    EXPECT_EQ(tok->decode(tok->encode(s, false, false), false), s);
  }
  // A lone continuation byte decodes to U+FFFD, as tokenizers does.
  EXPECT_EQ(tok->decode({0xA9}, false), "\xEF\xBF\xBD");
  // Ids outside the vocabulary are skipped.
  EXPECT_EQ(tok->decode({'h', 99999, -5, 'i'}, false), "hi");
}

TEST(DataTokenizerHf, AddedTokensMatchLongestFirst) {
  auto tok = load(byte_level_tokenizer());
  auto ids = tok->encode("a<|end|>b<|endoftext|>", false, false);
  EXPECT_EQ(ids, (std::vector<int32_t>{'a', kEnd, 'b', kEndOfText}));
  // Not quite a special token: plain bytes.
  auto partial = tok->encode("<|end|", false, false);
  EXPECT_EQ(std::count(partial.begin(), partial.end(), kEnd), 0);
  EXPECT_EQ(tok->decode(ids, true), "ab");
  EXPECT_EQ(tok->decode(ids, false), "a<|end|>b<|endoftext|>");
  // Non-special added tokens survive skip_special_tokens.
  auto note = tok->encode("x[note]", false, false);
  EXPECT_EQ(note, (std::vector<int32_t>{'x', kNote}));
  EXPECT_EQ(tok->decode(note, true), "x[note]");
  EXPECT_TRUE(tok->is_special(kEnd));
  EXPECT_FALSE(tok->is_special(kNote));
  EXPECT_EQ(tok->vocab_size(), 266);
}

TEST(DataTokenizerHf, AddedTokenStripFlags) {
  json t = byte_level_tokenizer();
  t["added_tokens"] = json::array({{{"id", kEnd},
                                    {"content", "<mask>"},
                                    {"special", true},
                                    {"lstrip", true},
                                    {"rstrip", false}},
                                   {{"id", kEndOfText},
                                    {"content", "<sep>"},
                                    {"special", true},
                                    {"lstrip", false},
                                    {"rstrip", true}},
                                   {{"id", kNote},
                                    {"content", "word"},
                                    {"special", false},
                                    {"normalized", false},
                                    {"single_word", true}}});
  auto tok = load(t);
  // lstrip swallows the spaces before <mask>; rstrip the spaces after <sep>.
  EXPECT_EQ(tok->encode("a  <mask>", false, false), (std::vector<int32_t>{'a', kEnd}));
  EXPECT_EQ(tok->encode("<sep>  b", false, false), (std::vector<int32_t>{kEndOfText, 'b'}));
  // single_word: only a whole word matches.
  EXPECT_EQ(tok->encode("word", false, false), (std::vector<int32_t>{kNote}));
  auto inside = tok->encode("swordfish", false, false);
  EXPECT_EQ(std::count(inside.begin(), inside.end(), kNote), 0);
}

TEST(DataTokenizerHf, AddedTokenIdsAreAssignedAsTokenizersDoes) {
  // The JSON ids are not read back: a token in the model keeps its model id, the others
  // follow the model's entry count in order (checked against tokenizers under Node).
  json t = {
      {"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}}, {"merges", {"a b"}}}},
      {"added_tokens", json::array({{{"id", 10}, {"content", "<x>"}, {"special", true}},
                                    {{"id", 5}, {"content", "<y>"}, {"special", true}},
                                    {{"id", 1}, {"content", "<z>"}, {"special", true}},
                                    {{"id", 7}, {"content", "a"}, {"special", true}}})}};
  auto tok = load(t);
  EXPECT_EQ(tok->token_to_id("<x>"), 3);
  EXPECT_EQ(tok->token_to_id("<y>"), 4);
  EXPECT_EQ(tok->token_to_id("<z>"), 5);
  EXPECT_EQ(tok->token_to_id("a"), 0);
  EXPECT_EQ(tok->vocab_size(), 6);
  // "a" is itself an added token here, so it is cut out before the merge "a b" could apply.
  EXPECT_EQ(tok->encode("<z>ab<x>", false, false), (std::vector<int32_t>{5, 0, 1, 3}));
}

TEST(DataTokenizerHf, BosEosFromConfigAndFlags) {
  json cfg = {{"bos_token", "<|endoftext|>"},
              {"eos_token", {{"content", "<|end|>"}, {"lstrip", false}}},
              {"pad_token", nullptr}};
  auto tok = load(byte_level_tokenizer(), cfg);
  EXPECT_EQ(tok->bos_id(), kEndOfText);
  EXPECT_EQ(tok->eos_id(), kEnd);
  EXPECT_EQ(tok->pad_id(), kEnd);  // no pad token: falls back to EOS
  EXPECT_EQ(tok->encode("a", true, true), (std::vector<int32_t>{kEndOfText, 'a', kEnd}));
  EXPECT_EQ(tok->encode("a", false, true), (std::vector<int32_t>{'a', kEnd}));
  EXPECT_FALSE(tok->default_add_bos());  // ByteLevel post-processor adds nothing
  EXPECT_EQ(tok->encode_with_special_tokens("a"), (std::vector<int32_t>{'a'}));
  cfg["add_bos_token"] = true;
  auto with_bos = load(byte_level_tokenizer(), cfg);
  EXPECT_TRUE(with_bos->default_add_bos());
  EXPECT_EQ(with_bos->encode_with_special_tokens("a"), (std::vector<int32_t>{kEndOfText, 'a'}));
  // No configuration at all: no BOS/EOS, pad 0.
  auto bare = load(byte_level_tokenizer());
  EXPECT_EQ(bare->bos_id(), -1);
  EXPECT_EQ(bare->eos_id(), -1);
  EXPECT_EQ(bare->pad_id(), 0);
  EXPECT_EQ(bare->encode("a", true, true), (std::vector<int32_t>{'a'}));
}

TEST(DataTokenizerHf, InvalidUtf8InputIsReadAsReplacementCharacter) {
  auto tok = load(byte_level_tokenizer());
  auto ids = tok->encode(
      "a\xFF"
      "b",
      false, false);
  EXPECT_EQ(tok->decode(ids, false),
            "a\xEF\xBF\xBD"
            "b");
}

TEST(DataTokenizerHf, SplitPreTokenizerWithRegexSequence) {
  // Llama 3's layout: Split(regex, Isolated) then ByteLevel without its own regex.
  json t = byte_level_tokenizer();
  t["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Split"},
                     {"pattern", {{"Regex", R"((?i:'s|'t)|\p{N}{1,3}| ?\p{L}+|\s+)"}}},
                     {"behavior", "Isolated"},
                     {"invert", false}},
                    {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  // "3 4" outranks "1 2": if 12345 were one piece it would become 12|34|5, grouped by three it
  // is 123|4|5. "' S" exists only if the case-insensitive contraction makes "'S" one piece.
  auto& vocab = t["model"]["vocab"];
  vocab["34"] = 400;
  vocab["12"] = 401;
  vocab["123"] = 402;
  vocab["'S"] = 403;
  t["model"]["merges"] = json::array({"3 4", "1 2", "12 3", "' S"});
  auto tok = load(t);
  EXPECT_EQ(tok->encode("12345", false, false), (std::vector<int32_t>{402, '4', '5'}));
  EXPECT_EQ(tok->encode("IT'S", false, false), (std::vector<int32_t>{'I', 'T', 403}));
  EXPECT_EQ(tok->decode(tok->encode("IT'S 12345 the", false, false), false), "IT'S 12345 the");
}

// --- SentencePiece-style BPE (Llama 2 conversion) ----------------------------------------

const char* kSp = "\xE2\x96\x81";  // ▁

json spm_tokenizer() {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  int next = 3;
  char name[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = next++;
  }
  const std::string sp = kSp;
  for (const std::string& s : {sp, std::string("a"), std::string("b"), std::string("c")})
    vocab[s] = next++;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {sp, "a"}, {sp + "a", "b"}, {"a", "b"}, {"ab", "ab"}, {sp, "c"}};
  json m = json::array();
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = next++;
    m.push_back(a + " " + b);
  }
  json t;
  t["added_tokens"] =
      json::array({{{"id", 0}, {"content", "<unk>"}, {"special", true}, {"normalized", false}},
                   {{"id", 1}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
                   {{"id", 2}, {"content", "</s>"}, {"special", true}, {"normalized", false}}});
  t["normalizer"] = {
      {"type", "Sequence"},
      {"normalizers",
       json::array({{{"type", "Prepend"}, {"prepend", sp}},
                    {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", sp}}})}};
  t["pre_tokenizer"] = nullptr;
  t["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
      {"pair", json::array()},
      {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}};
  t["decoder"] = {
      {"type", "Sequence"},
      {"decoders",
       json::array({{{"type", "Replace"}, {"pattern", {{"String", sp}}}, {"content", " "}},
                    {{"type", "ByteFallback"}},
                    {{"type", "Fuse"}},
                    {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
  t["model"] = {{"type", "BPE"},        {"vocab", vocab},        {"merges", m},
                {"unk_token", "<unk>"}, {"byte_fallback", true}, {"fuse_unk", true}};
  return t;
}

TEST(DataTokenizerHf, SentencePieceStyleEncodeDecode) {
  auto tok = load(spm_tokenizer());
  const std::string sp = kSp;
  EXPECT_EQ(tok->encode("ab c", false, false),
            ids_of(*tok, {(sp + "ab").c_str(), (sp + "c").c_str()}));
  EXPECT_EQ(tok->encode("abab", false, false), ids_of(*tok, {(sp + "ab").c_str(), "ab"}));
  // é is not in the vocabulary: its two UTF-8 bytes as <0xC3><0xA9>.
  EXPECT_EQ(tok->encode("c\xC3\xA9", false, false),
            ids_of(*tok, {(sp + "c").c_str(), "<0xC3>", "<0xA9>"}));
  for (const char* s : {"ab c", "  ab  ", "c\xC3\xA9\xF0\x9F\x98\x80", "a\nb", ""})
    EXPECT_EQ(tok->decode(tok->encode(s, false, false), false), s) << s;
  // Invalid byte runs decode to one U+FFFD per byte.
  EXPECT_EQ(tok->decode(ids_of(*tok, {"<0xC3>", "<0xC3>"}), false), "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(DataTokenizerHf, SentencePieceStyleTemplateAndSpecialText) {
  auto tok = load(spm_tokenizer(), json{{"add_bos_token", true},
                                        {"add_eos_token", false},
                                        {"bos_token", "<s>"},
                                        {"eos_token", "</s>"}});
  EXPECT_TRUE(tok->default_add_bos());
  EXPECT_FALSE(tok->default_add_eos());
  auto ids = tok->encode_with_special_tokens("ab");
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(tok->encode("ab", true, true).back(), 2);
  // "<s>" in the text is the BOS token; each side of it gets its own ▁ prefix (as tokenizers).
  const std::string sp = kSp;
  EXPECT_EQ(tok->encode("ab<s>ab", false, false),
            ids_of(*tok, {(sp + "ab").c_str(), "<s>", (sp + "ab").c_str()}));
  EXPECT_EQ(tok->decode(tok->encode("ab<s>c", false, false), true), "ab c");
  // Template without config: BOS comes from the post-processor.
  auto bare = load(spm_tokenizer());
  EXPECT_EQ(bare->bos_id(), 1);
  EXPECT_TRUE(bare->default_add_bos());
}

TEST(DataTokenizerHf, UnknownCharactersFuseIntoOneUnk) {
  json t = spm_tokenizer();
  t["model"]["byte_fallback"] = false;
  auto tok = load(t);
  const std::string sp = kSp;
  // x, y, z are not in the vocabulary and there is no byte fallback: one fused <unk>.
  EXPECT_EQ(tok->encode("abxyz", false, false), ids_of(*tok, {(sp + "ab").c_str(), "<unk>"}));
  t["model"]["fuse_unk"] = false;
  EXPECT_EQ(load(t)->encode("xyz", false, false), ids_of(*tok, {kSp, "<unk>", "<unk>", "<unk>"}));
}

// A naive BPE (merge the lowest-ranked adjacent pair, leftmost first, until none applies) to
// check the cached/heap merge loop on random words, short and long.
std::vector<std::string> naive_bpe(std::vector<std::string> syms,
                                   const std::vector<std::pair<std::string, std::string>>& merges) {
  for (;;) {
    size_t best = syms.size(), best_rank = merges.size();
    for (size_t k = 0; k + 1 < syms.size(); ++k)
      for (size_t r = 0; r < best_rank; ++r)
        if (merges[r].first == syms[k] && merges[r].second == syms[k + 1]) {
          best = k;
          best_rank = r;
          break;
        }
    if (best == syms.size()) return syms;
    syms[best] += syms[best + 1];
    syms.erase(syms.begin() + best + 1);
  }
}

TEST(DataTokenizerHf, MergeLoopMatchesNaiveBpeOnShortAndLongWords) {
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"a", "b"},  {"b", "a"},  {"ab", "ab"}, {"a", "a"},  {"ba", "b"},   {"abab", "a"},
      {"c", "ab"}, {"aa", "a"}, {"b", "b"},   {"bb", "c"}, {"cab", "ab"}, {"ab", "c"}};
  json vocab = {{"a", 0}, {"b", 1}, {"c", 2}};
  int next = 3;
  json m = json::array();
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = next++;
    m.push_back(a + " " + b);
  }
  json t;
  t["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}};
  auto tok = load(t);
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    size_t len = 1 + rng() % (trial < 150 ? 20 : 200);  // long words take the heap path
    std::string word;
    std::vector<std::string> syms;
    for (size_t k = 0; k < len; ++k) {
      char c = "abc"[rng() % 3];
      word.push_back(c);
      syms.emplace_back(1, c);
    }
    std::vector<int32_t> want;
    for (const auto& s : naive_bpe(syms, merges)) want.push_back(*tok->token_to_id(s));
    ASSERT_EQ(tok->encode(word, false, false), want) << word;
    ASSERT_EQ(tok->encode(word, false, false), want) << word << " (cached)";
  }
}

TEST(DataTokenizerHf, FromFileReadsConfigBeside) {
  testing::TempDir dir;
  std::ofstream(dir / "tokenizer.json") << spm_tokenizer().dump();
  std::ofstream(dir / "tokenizer_config.json")
      << json{{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"add_bos_token", false}}.dump();
  auto tok = HfTokenizer::from_file(dir / "tokenizer.json");
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_FALSE(tok->default_add_bos());  // the config overrides the template
  EXPECT_EQ(tok->encode_with_special_tokens("ab")[0], *tok->token_to_id(std::string(kSp) + "ab"));
}

// --- bad input -----------------------------------------------------------------------------

// Loading `text` throws fusetune::Error whose message contains `needle`.
void expect_load_error(const std::string& text, const std::string& needle,
                       const json& cfg = json()) {
  try {
    HfTokenizer::from_json(text, cfg.is_null() ? "" : cfg.dump(), "bad tokenizer.json");
    ADD_FAILURE() << "no error for: " << text.substr(0, 200);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << needle;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

TEST(DataTokenizerHf, BadInputGivesClearErrors) {
  expect_load_error("this is not json", "is not valid JSON");
  expect_load_error("", "is not valid JSON");
  expect_load_error("[1, 2]", "must be a JSON object");
  expect_load_error(R"({"model": 5555555555E525555})", "is not valid JSON");  // number overflow
  expect_load_error("{}", "model is missing");
  expect_load_error(R"({"model": {"type": "WordPiece", "vocab": {}}})",
                    "'WordPiece' is not supported");
  expect_load_error(R"({"model": {"type": "Unigram", "vocab": []}})", "sentencepiece");
  expect_load_error(R"({"model": {"type": "BPE", "merges": []}})", "model.vocab is missing");
  expect_load_error(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a zz"]}})",
                    "names token 'zz' that is not in model.vocab");
  expect_load_error(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]}})",
                    "makes 'ab', which is not in model.vocab");
  expect_load_error(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["ab"]}})",
                    "two tokens separated by one space");
  expect_load_error(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [["a"]]}})",
                    "model.merges[0]");
  expect_load_error(R"({"model": {"type": "BPE", "vocab": {"a": "zero"}, "merges": []}})",
                    "must map to an integer id");
  expect_load_error(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 0}, "merges": []}})",
                    "gives id 0 to two tokens");
  expect_load_error(R"({"model": {"type": "BPE", "vocab": {"a": -3}, "merges": []}})",
                    "negative id");
  expect_load_error(R"({"model": {"type": "BPE", "vocab": {"a": 1000000000}, "merges": []}})",
                    "far beyond the vocabulary");
  expect_load_error(
      R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [], "unk_token": "<unk>"}})",
      "unk_token '<unk>' is not in model.vocab");
  const std::string ok_model = R"("model": {"type": "BPE", "vocab": {"a": 0}, "merges": []})";
  expect_load_error("{" + ok_model + R"(, "normalizer": {"type": "NFCC"}})", "did you mean 'NFC'");
  expect_load_error("{" + ok_model + R"(, "pre_tokenizer": {"type": "BertPreTokenizer"}})",
                    "pre_tokenizer type 'BertPreTokenizer' is not supported");
  expect_load_error(
      "{" + ok_model +
          R"(, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"}})",
      "does not compile");
  expect_load_error(
      "{" + ok_model +
          R"(, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Sideways"}})",
      "unknown split behavior 'Sideways'");
  expect_load_error("{" + ok_model + R"(, "decoder": {"type": "WordPiece"}})",
                    "decoder type 'WordPiece'");
  expect_load_error("{" + ok_model + R"(, "post_processor": {"type": "Magic"}})",
                    "post_processor type 'Magic'");
  expect_load_error("{" + ok_model + R"(, "added_tokens": [{"id": 5}]})",
                    "added_tokens[0].content is missing");
  expect_load_error("{" + ok_model + R"(, "added_tokens": [{"id": "x", "content": "x"}]})",
                    "added_tokens[0].id must be an integer");
  expect_load_error("{" + ok_model + R"(, "normalizer": {"type": "Prepend", "prepend": 5}})",
                    "normalizer.prepend must be a string");
  expect_load_error(
      "{" + ok_model + R"(, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": "yes"}})",
      "add_prefix_space must be true or false");
  expect_load_error("{" + ok_model + "}", "bos_token '<s>' is not a token",
                    json{{"bos_token", "<s>"}});
}

TEST(DataTokenizerHf, MissingFileNamesThePath) {
  try {
    HfTokenizer::from_file("/nonexistent/dir/tokenizer.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/tokenizer.json"), std::string::npos);
  }
}

}  // namespace
}  // namespace fusetune
