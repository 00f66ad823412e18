// The less common tokenizer.json components, checked against Hugging Face's tokenizers (under
// Node) on the tokenizer corpus: synthetic tokenizer.json files the test writes, each
// exercising a normalizer / pre-tokenizer / decoder / added-token option / post-processor that
// the real assets do not use. Needs Node and the installed reference, not the assets.
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fusetune/tokenizers/byte_level.h"
#include "fusetune/tokenizers/hf_tokenizer.h"
#include "tokenizer_reference.h"

namespace fusetune {
namespace {

using nlohmann::json;
using testing::printable;

const std::string kSp = "\xE2\x96\x81";  // ▁
const std::string kG = "\xC4\xA0";       // Ġ

// English-ish merges over a base alphabet; `space` is the word-start marker (Ġ or ▁).
std::vector<std::pair<std::string, std::string>> merges_for(const std::string& space) {
  return {{space, "t"}, {"h", "e"},         {space + "t", "he"}, {"i", "n"}, {"e", "r"},
          {"a", "n"},   {space, "a"},       {"o", "n"},          {"r", "e"}, {space, "s"},
          {"e", "d"},   {"in", "g"},        {space, "w"},        {"o", "u"}, {space, "c"},
          {"l", "l"},   {space + "a", "n"}, {space + "an", "d"}, {"1", "2"}, {"12", "3"}};
}

json byte_level_model(bool ignore_merges = false) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level::encode_byte(static_cast<unsigned char>(b))] = b;
  json merges = json::array();
  for (const auto& [a, b] : merges_for(kG)) {
    if (!vocab.contains(a + b)) vocab[a + b] = int(vocab.size());
    merges.push_back(a + " " + b);
  }
  return {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", nullptr},
          {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr},
          {"fuse_unk", false},
          {"byte_fallback", false},
          {"ignore_merges", ignore_merges},
          {"vocab", vocab},
          {"merges", merges}};
}

// SentencePiece-like: <unk>, <s>, </s>, 256 byte pieces, ▁, ASCII letters/digits, merges.
json spm_model(bool byte_fallback, bool fuse_unk) {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  char name[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = int(vocab.size());
  }
  vocab[kSp] = int(vocab.size());
  for (char c = 'a'; c <= 'z'; ++c) vocab[std::string(1, c)] = int(vocab.size());
  for (char c = '0'; c <= '9'; ++c) vocab[std::string(1, c)] = int(vocab.size());
  json merges = json::array();
  for (const auto& [a, b] : merges_for(kSp)) {
    if (!vocab.contains(a + b)) vocab[a + b] = int(vocab.size());
    merges.push_back(a + " " + b);
  }
  return {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", "<unk>"},
          {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr},
          {"fuse_unk", fuse_unk},
          {"byte_fallback", byte_fallback},
          {"ignore_merges", false},
          {"vocab", vocab},
          {"merges", merges}};
}

json added(int id, const std::string& content, bool special, bool lstrip = false,
           bool rstrip = false, bool single_word = false, bool normalized = false) {
  return {{"id", id},          {"content", content}, {"single_word", single_word},
          {"lstrip", lstrip},  {"rstrip", rstrip},   {"normalized", normalized},
          {"special", special}};
}

json byte_level_pre(bool add_prefix_space, bool use_regex) {
  return {{"type", "ByteLevel"},
          {"add_prefix_space", add_prefix_space},
          {"trim_offsets", true},
          {"use_regex", use_regex}};
}
const json kByteLevelDecoder = {
    {"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};

json split(const json& pattern, const std::string& behavior, bool invert) {
  return {{"type", "Split"}, {"pattern", pattern}, {"behavior", behavior}, {"invert", invert}};
}

json tokenizer(json model, json normalizer, json pre, json post, json decoder,
               json added_tokens = json::array()) {
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added_tokens},
          {"normalizer", normalizer},
          {"pre_tokenizer", pre},
          {"post_processor", post},
          {"decoder", decoder},
          {"model", model}};
}

json seq(const char* key, std::vector<json> items) {
  std::string type = "Sequence";
  return {{"type", type}, {key, items}};
}

struct Synthetic {
  std::string name;
  json tokenizer;
  bool compare_decode = true;
};

std::vector<Synthetic> synthetic_tokenizers() {
  std::vector<Synthetic> out;
  // byte_level_model() has 276 entries: added tokens take ids from 276 on (tokenizers' rule).
  const json byte_added = json::array({added(276, "<|end|>", true), added(277, "[note]", false)});
  // Normalizers: NFKC + Lowercase, Strip, StripAccents after NFD, regex Replace.
  out.push_back({"nfkc_lowercase",
                 tokenizer(byte_level_model(),
                           seq("normalizers", {{{"type", "NFKC"}}, {{"type", "Lowercase"}}}),
                           byte_level_pre(false, true), nullptr, kByteLevelDecoder, byte_added),
                 false});
  out.push_back(
      {"strip_accents_replace",
       tokenizer(byte_level_model(),
                 seq("normalizers",
                     {{{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
                      {{"type", "NFD"}},
                      {{"type", "StripAccents"}},
                      {{"type", "Replace"}, {"pattern", {{"Regex", "\\s+"}}}, {"content", " "}},
                      {{"type", "NFC"}}}),
                 byte_level_pre(false, true), nullptr, kByteLevelDecoder, byte_added),
       false});
  // Pre-tokenizers: every Split behavior, invert, String patterns; Digits; Whitespace(Split).
  for (const char* bh : {"Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"})
    for (bool invert : {false, true})
      out.push_back({std::string("split_") + bh + (invert ? "_invert" : ""),
                     tokenizer(byte_level_model(), nullptr,
                               seq("pretokenizers", {split({{"Regex", "\\s+|\\p{P}"}}, bh, invert),
                                                     byte_level_pre(false, false)}),
                               nullptr, kByteLevelDecoder, byte_added),
                     false});
  out.push_back({"split_string_isolated",
                 tokenizer(byte_level_model(), nullptr,
                           seq("pretokenizers", {split({{"String", "e"}}, "Isolated", false),
                                                 byte_level_pre(true, false)}),
                           nullptr, kByteLevelDecoder, byte_added),
                 false});
  out.push_back({"digits_prefix_space",
                 tokenizer(byte_level_model(), nullptr,
                           seq("pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}},
                                                 byte_level_pre(true, true)}),
                           nullptr, kByteLevelDecoder, byte_added),
                 false});
  out.push_back(
      {"whitespace",
       tokenizer(byte_level_model(), nullptr,
                 seq("pretokenizers", {{{"type", "Whitespace"}}, byte_level_pre(false, false)}),
                 nullptr, kByteLevelDecoder, byte_added),
       false});
  out.push_back({"whitespace_split",
                 tokenizer(byte_level_model(), nullptr,
                           seq("pretokenizers",
                               {{{"type", "WhitespaceSplit"}}, byte_level_pre(false, false)}),
                           nullptr, kByteLevelDecoder, byte_added),
                 false});
  // Added tokens: lstrip / rstrip / single_word / normalized, matched after Lowercase.
  out.push_back({"added_token_flags",
                 tokenizer(byte_level_model(true), {{"type", "Lowercase"}},
                           byte_level_pre(false, true), nullptr, kByteLevelDecoder,
                           json::array({added(276, "<mask>", true, true, false),
                                        added(277, "<sep>", true, false, true),
                                        added(278, "the", false, false, false, true, false),
                                        added(279, "hello", false, false, false, false, true),
                                        added(280, "<|eot_id|>", true, true, true),
                                        added(281, "<|", false)}))});
  // Metaspace pre-tokenizer + decoder, every prepend scheme, with and without split.
  for (const char* scheme : {"always", "first", "never"})
    for (bool split_on : {true, false}) {
      json meta = {{"type", "Metaspace"},
                   {"replacement", kSp},
                   {"prepend_scheme", scheme},
                   {"split", split_on}};
      out.push_back({std::string("metaspace_") + scheme + (split_on ? "_split" : ""),
                     tokenizer(spm_model(true, false), nullptr, meta, nullptr,
                               seq("decoders", {{{"type", "Metaspace"},
                                                 {"replacement", kSp},
                                                 {"prepend_scheme", scheme},
                                                 {"split", split_on}},
                                                {{"type", "ByteFallback"}},
                                                {{"type", "Fuse"}}}),
                               json::array({added(0, "<unk>", true), added(1, "<s>", true),
                                            added(2, "</s>", true)}))});
    }
  // SentencePiece-style without byte fallback: unknown characters, fused or not.
  for (bool fuse : {true, false}) {
    json norm = seq("normalizers",
                    {{{"type", "Prepend"}, {"prepend", kSp}},
                     {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSp}}});
    json dec =
        seq("decoders", {{{"type", "Replace"}, {"pattern", {{"String", kSp}}}, {"content", " "}},
                         {{"type", "ByteFallback"}},
                         {{"type", "Fuse"}},
                         {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}});
    out.push_back({std::string("spm_unk") + (fuse ? "_fused" : ""),
                   tokenizer(spm_model(false, fuse), norm, nullptr, nullptr, dec,
                             json::array({added(1, "<s>", true), added(2, "</s>", true)}))});
  }
  // Word-piece style affixes: continuing_subword_prefix "##", end_of_word_suffix "</w>" with
  // the BPEDecoder; unknown characters become <unk>.
  for (bool suffix : {false, true}) {
    json vocab = {{"<unk>", 0}};
    for (char c = '!'; c <= '~'; ++c) {
      const std::string ch(1, c);
      vocab[ch] = int(vocab.size());
      vocab[suffix ? ch + "</w>" : "##" + ch] = int(vocab.size());
    }
    std::vector<std::pair<std::string, std::string>> pairs =
        suffix ? std::vector<std::pair<std::string, std::string>>{{"t", "h"}, {"th", "e</w>"},
                                                                  {"i", "n"}, {"in", "g</w>"},
                                                                  {"a", "n"}, {"an", "d</w>"}}
               : std::vector<std::pair<std::string, std::string>>{{"t", "##h"},   {"th", "##e"},
                                                                  {"i", "##n"},   {"in", "##g"},
                                                                  {"##i", "##n"}, {"##in", "##g"}};
    json merges = json::array();
    for (const auto& [a, b] : pairs) {
      std::string merged = a + (suffix ? b : b.substr(2));
      if (!vocab.contains(merged)) vocab[merged] = int(vocab.size());
      merges.push_back(a + " " + b);
    }
    json model = {{"type", "BPE"},
                  {"dropout", nullptr},
                  {"unk_token", "<unk>"},
                  {"continuing_subword_prefix", suffix ? json() : json("##")},
                  {"end_of_word_suffix", suffix ? json("</w>") : json()},
                  {"fuse_unk", false},
                  {"byte_fallback", false},
                  {"ignore_merges", false},
                  {"vocab", vocab},
                  {"merges", merges}};
    json dec = suffix ? json{{"type", "BPEDecoder"}, {"suffix", "</w>"}} : json();
    out.push_back({suffix ? "end_of_word_suffix" : "continuing_subword_prefix",
                   tokenizer(model, nullptr, {{"type", "WhitespaceSplit"}}, nullptr, dec,
                             json::array({added(0, "<unk>", true)}))});
  }
  // Post-processors (compared with add_special_tokens): Roberta, Bert, a Sequence of them.
  json roberta = {{"type", "RobertaProcessing"},
                  {"sep", {"<|end|>", 276}},
                  {"cls", {"[note]", 277}},
                  {"trim_offsets", true},
                  {"add_prefix_space", false}};
  json bert = {{"type", "BertProcessing"}, {"sep", {"<|end|>", 276}}, {"cls", {"[note]", 277}}};
  out.push_back({"post_roberta", tokenizer(byte_level_model(), nullptr, byte_level_pre(false, true),
                                           roberta, kByteLevelDecoder, byte_added)});
  out.push_back({"post_bert", tokenizer(byte_level_model(), nullptr, byte_level_pre(false, true),
                                        bert, kByteLevelDecoder, byte_added)});
  out.push_back(
      {"post_sequence", tokenizer(byte_level_model(), nullptr, byte_level_pre(false, true),
                                  seq("processors", {byte_level_pre(false, true), bert}),
                                  kByteLevelDecoder, byte_added)});
  return out;
}

class HfSynthetic : public ::testing::TestWithParam<Synthetic> {};

TEST_P(HfSynthetic, MatchesReference) {
  const std::string impl = "hf";  // @lenml/tokenizers lacks several of these components
  const std::string why = testing::reference_unavailable(impl);
  if (!why.empty()) FT_SKIP_UNLESS_REQUIRED("tokenizer reference unavailable: " + why);
  const Synthetic& c = GetParam();
  testing::TempDir tmp;
  const auto path = tmp / "tokenizer.json";
  std::ofstream(path) << c.tokenizer.dump(1);
  auto tok = HfTokenizer::from_file(path);
  for (bool with_special : {false, true}) {
    auto expected =
        testing::run_reference(path, testing::tokenizer_corpus(), tmp.path(), with_special, impl);
    ASSERT_GE(expected.size(), 300u);
    size_t bad_ids = 0, bad_decode = 0;
    for (const auto& e : expected) {
      auto ids = with_special ? tok->encode_with_special_tokens(e.text)
                              : tok->encode(e.text, false, false);
      if (ids != e.ids && ++bad_ids <= 5)
        ADD_FAILURE() << c.name << (with_special ? " (with special tokens)" : "")
                      << " ids differ for " << printable(e.text)
                      << "\n  fusetune:  " << testing::ids_str(ids)
                      << "\n  reference: " << testing::ids_str(e.ids);
      if (!c.compare_decode) continue;
      std::string d = tok->decode(e.ids, false), ds = tok->decode(e.ids, true);
      if ((d != e.decoded || ds != e.decoded_skip) && ++bad_decode <= 5)
        ADD_FAILURE() << c.name << " decode differs for ids of " << printable(e.text)
                      << "\n  fusetune:  " << printable(d) << " / skip " << printable(ds)
                      << "\n  reference: " << printable(e.decoded) << " / skip "
                      << printable(e.decoded_skip);
    }
    EXPECT_EQ(bad_ids, 0u) << c.name;
    EXPECT_EQ(bad_decode, 0u) << c.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Components, HfSynthetic, ::testing::ValuesIn(synthetic_tokenizers()),
                         [](const auto& p) { return p.param.name; });

}  // namespace
}  // namespace fusetune
