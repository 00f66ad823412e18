// The tokenizer files torchtune's configs point at give the same ids as the Hugging Face
// tokenizer.json of the same vocabulary, over the whole tokenizer corpus
// (tests/data/tokenizer_corpus.jsonl):
//   - Llama 3's tiktoken original/tokenizer.model (torchtune's llama3_tokenizer) against
//     tokenizers/llama3/tokenizer.json;
//   - a vocab.json + merges.txt pair written here from tokenizers/qwen3/tokenizer.json
//     (torchtune's qwen2_5_tokenizer and qwen3_tokenizer; Qwen3 shares Qwen2's NFC +
//     pre-tokenizer regex) against that tokenizer.json.
// HfTokenizer itself is checked against Hugging Face's tokenizers on the same corpus
// (tokenizer_hf_conformance_test.cpp). Also: decode round trips, and every torchtune config
// in the assets has a tokenizer section fusetune accepts.
#include <iostream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "bpe_files.h"
#include "fusetune/config/components.h"
#include "fusetune/config/recipe_schemas.h"
#include "fusetune/config/schema.h"
#include "fusetune/recipes/recipe_setup.h"
#include "fusetune/tokenizers/load_tokenizer.h"
#include "fusetune/tokenizers/qwen2_tokenizer.h"
#include "fusetune/tokenizers/tiktoken_tokenizer.h"
#include "fusetune/tokenizers/unicode_normalize.h"
#include "tiny_llama.h"
#include "tokenizer_reference.h"

namespace fusetune {
namespace {

using testing::printable;

constexpr const char* kLlama3Json = "tokenizers/llama3/tokenizer.json";
constexpr const char* kLlama3Model = "tokenizers/llama3/original/tokenizer.model";
constexpr const char* kQwen3Json = "tokenizers/qwen3/tokenizer.json";

// Whether `text` holds a special token on which the two tables disagree (absent from one,
// or with another id): the ids of such a string are expected to differ.
bool has_disputed_special(const std::string& text, const std::vector<SpecialToken>& a,
                          const std::vector<SpecialToken>& b) {
  for (const auto* t : {&a, &b})
    for (const SpecialToken& s : *t)
      if (text.find(s.content) != std::string::npos &&
          special_token_id(a, s.content) != special_token_id(b, s.content))
        return true;
  return false;
}

struct Tally {
  size_t strings = 0, ids = 0, mismatches = 0, decode_failures = 0, disputed = 0;
};

// Compares `tok` with `ref` on every corpus string; `expected_differ(text)` marks strings
// allowed to differ (they are counted, not compared).
Tally compare(const Tokenizer& tok, const HfTokenizer& ref, bool nfc, const char* what,
              const std::function<bool(const std::string&)>& expected_differ) {
  Tally t;
  for (const std::string& s : testing::read_corpus(testing::tokenizer_corpus())) {
    if (expected_differ && expected_differ(s)) {
      ++t.disputed;
      continue;
    }
    ++t.strings;
    const auto want = ref.encode(s, false, false);
    const auto got = tok.encode(s, false, false);
    t.ids += want.size();
    if (got != want && ++t.mismatches <= 10)
      ADD_FAILURE() << what << ": ids differ for " << printable(s)
                    << "\n  file:           " << testing::ids_str(got)
                    << "\n  tokenizer.json: " << testing::ids_str(want);
    const std::string back = tok.decode(got, false);
    const std::string orig = nfc ? unicode::normalize(s, unicode::NormalForm::NFC) : s;
    // (decode with skip_special_tokens is not compared: torchtune's tokenizers skip all of
    // their special tokens, tokenizer.json only those marked special.)
    if ((back != orig || tok.decode(want, false) != ref.decode(want, false)) &&
        ++t.decode_failures <= 10)
      ADD_FAILURE() << what << ": decode differs for " << printable(s) << ": got "
                    << printable(back);
  }
  std::cout << "[ " << what << " ] " << t.strings << " strings, " << t.ids << " ids compared; "
            << t.mismatches << " differ; " << t.decode_failures << " decode failures";
  if (t.disputed)
    std::cout << "; " << t.disputed << " strings with disputed special tokens skipped";
  std::cout << "\n";
  ::testing::Test::RecordProperty(std::string(what) + "_strings", int(t.strings));
  ::testing::Test::RecordProperty(std::string(what) + "_ids", int(t.ids));
  EXPECT_GE(t.strings, 300u) << "corpus too small";
  EXPECT_EQ(t.mismatches, 0u);
  EXPECT_EQ(t.decode_failures, 0u);
  return t;
}

TEST(TorchtuneTokenizerFiles, Llama3TiktokenEqualsTokenizerJson) {
  FT_REQUIRE_ASSET(kLlama3Json);
  FT_REQUIRE_ASSET(kLlama3Model);
  const auto json_path = testing::assets_dir() / kLlama3Json;
  auto ref = testing::shared_hf_tokenizer(json_path);
  // special_tokens_path = the tokenizer.json: the same special tokens as the reference.
  auto tik = load_llama3_tiktoken(testing::assets_dir() / kLlama3Model, json_path);
  EXPECT_EQ(tik->vocab_size(), ref->vocab_size());
  EXPECT_EQ(tik->bos_id(), 128000);
  EXPECT_EQ(tik->eos_id(), 128001);
  compare(*tik, *ref, false, "llama3_tiktoken_special_tokens_path", nullptr);

  // torchtune's own table (no special_tokens_path): it names 128004, 128005, 128008 and
  // 128010.. differently from this (Llama 3.0) tokenizer.json, so strings holding a special
  // token the two tables disagree on are set aside; every other string must match.
  auto tik_default = load_llama3_tiktoken(testing::assets_dir() / kLlama3Model);
  const auto hf_specials = read_special_tokens_file(json_path);
  const auto tt_specials = llama3_special_tokens();
  Tally t = compare(
      *tik_default, *ref, false, "llama3_tiktoken_torchtune_specials",
      [&](const std::string& s) { return has_disputed_special(s, hf_specials, tt_specials); });
  EXPECT_LE(t.disputed, 5u);
  EXPECT_EQ(tik_default->vocab_size(), 128256);
  EXPECT_EQ(tik_default->pad_id(), 128004);
}

// Qwen3's tokenizer.json as the vocab.json + merges.txt pair a Hugging Face Qwen directory
// holds (torchtune's qwen*_tokenizer reads those), written into `dir`.
nlohmann::json write_qwen3_vocab_and_merges(const testing::TempDir& dir) {
  return testing::write_vocab_and_merges(testing::assets_dir() / kQwen3Json, dir.path());
}

TEST(TorchtuneTokenizerFiles, Qwen2VocabAndMergesEqualTokenizerJson) {
  FT_REQUIRE_ASSET(kQwen3Json);
  const auto json_path = testing::assets_dir() / kQwen3Json;
  testing::TempDir dir;
  const nlohmann::json j = write_qwen3_vocab_and_merges(dir);
  // Qwen3's tokenizer.json has Qwen2's normalizer and pre-tokenizer regex.
  EXPECT_EQ(j["normalizer"]["type"], "NFC");
  EXPECT_EQ(j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"].get<std::string>(),
            kQwen2Pattern);
  auto ref = testing::shared_hf_tokenizer(json_path);

  TokenizerSpec spec;
  spec.type = "qwen2_5";
  spec.path = dir / "vocab.json";
  spec.merges_file = dir / "merges.txt";
  spec.special_tokens_path = json_path;
  auto with_path = load_tokenizer(spec);
  EXPECT_EQ(with_path->vocab_size(), ref->vocab_size());
  compare(*with_path, *ref, true, "qwen_vocab_merges_special_tokens_path", nullptr);

  // torchtune's Qwen2.5 table: Qwen3 adds <tool_response>, </tool_response>, <think>,
  // </think> (151665..151668), which are plain text to it.
  spec.special_tokens_path.clear();
  auto with_table = load_tokenizer(spec);
  EXPECT_EQ(with_table->eos_id(), 151645);
  EXPECT_EQ(with_table->pad_id(), 151643);
  const auto hf_specials = read_special_tokens_file(json_path);
  const auto tt_specials = qwen2_5_special_tokens();
  compare(*with_table, *ref, true, "qwen_vocab_merges_qwen2_5_specials",
          [&](const std::string& s) { return has_disputed_special(s, hf_specials, tt_specials); });
}

// torchtune's qwen3_tokenizer: the same files with Qwen3's own special-token table, which is
// tokenizer.json's added_tokens exactly: 0 differences over the corpus, <think> included.
TEST(TorchtuneTokenizerFiles, Qwen3VocabAndMergesWithQwen3TableEqualTokenizerJson) {
  FT_REQUIRE_ASSET(kQwen3Json);
  const auto json_path = testing::assets_dir() / kQwen3Json;
  testing::TempDir dir;
  write_qwen3_vocab_and_merges(dir);
  const auto hf_specials = read_special_tokens_file(json_path);
  const auto table = qwen3_special_tokens();
  ASSERT_EQ(table.size(), hf_specials.size());
  for (size_t i = 0; i < table.size(); ++i) {
    EXPECT_EQ(table[i].content, hf_specials[i].content);
    EXPECT_EQ(table[i].id, hf_specials[i].id);
  }
  TokenizerSpec spec;
  spec.type = "qwen3";
  spec.path = dir / "vocab.json";
  spec.merges_file = dir / "merges.txt";
  auto qwen3 = load_tokenizer(spec);
  auto ref = testing::shared_hf_tokenizer(json_path);
  EXPECT_EQ(qwen3->vocab_size(), ref->vocab_size());
  EXPECT_EQ(qwen3->eos_id(), 151645);  // <|im_end|>, as torchtune
  EXPECT_EQ(qwen3->encode("<think>\nhmm</think>", false, false),
            ref->encode("<think>\nhmm</think>", false, false));
  EXPECT_EQ(qwen3->encode("<think>", false, false), (std::vector<int32_t>{151667}));
  compare(*qwen3, *ref, true, "qwen3_vocab_merges_qwen3_specials", nullptr);
}

TEST(TorchtuneTokenizerFiles, PastedLlama3SectionLoadsTheTiktokenFile) {
  FT_REQUIRE_ASSET(kLlama3Model);
  Config cfg = Config::from_string(
      "tokenizer:\n  _component_: torchtune.models.llama3.llama3_tokenizer\n  path: " +
          (testing::assets_dir() / kLlama3Model).string() + "\n  max_seq_len: null\n",
      "pasted.yaml");
  auto tok = build_tokenizer(cfg);
  EXPECT_EQ(tok->vocab_size(), 128256);
  EXPECT_EQ(tok->encode("Hello world", true, false), (std::vector<int32_t>{128000, 9906, 1917}));
}

// Every tokenizer section of torchtune's configs in the assets validates as it is.
TEST(TorchtuneTokenizerFiles, AssetConfigsTokenizerSectionsValidate) {
  FT_REQUIRE_ASSET("torchtune_configs");
  const std::string base = testing::tiny_config_yaml("");
  size_t sections = 0;
  std::map<std::string, int> by_component;
  for (const auto& e :
       std::filesystem::recursive_directory_iterator(testing::assets_dir() / "torchtune_configs")) {
    if (e.path().extension() != ".yaml") continue;
    Config cfg = Config::from_file(e.path().string());
    if (!cfg.is_map("tokenizer")) continue;
    std::string section = cfg.sub("tokenizer").to_yaml();
    std::string indented = "tokenizer:\n";
    size_t pos = 0;
    while (pos < section.size()) {
      size_t eol = section.find('\n', pos);
      if (eol == std::string::npos) eol = section.size();
      indented += "  " + section.substr(pos, eol - pos) + "\n";
      pos = eol + 1;
    }
    Config c = Config::from_string(base + indented, e.path().string());
    Problems p = check_config(c, full_finetune_schema());
    for (const auto& err : p.errors) ADD_FAILURE() << e.path() << ": " << err;
    for (const auto& w : p.warnings)
      if (w.find("tokenizer") != std::string::npos) ADD_FAILURE() << e.path() << ": " << w;
    ++by_component[canonical_component(c, "tokenizer")];
    ++sections;
  }
  std::cout << "[ torchtune configs ] " << sections << " tokenizer sections:";
  for (const auto& [k, v] : by_component) std::cout << " " << k << " " << v;
  std::cout << "\n";
  EXPECT_GE(sections, 80u);
}

}  // namespace
}  // namespace fusetune
