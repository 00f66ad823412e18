// Exact-id conformance of HfTokenizer with Hugging Face's own tokenizers library (run under
// Node, tools/tokenizer-ref) on tests/data/tokenizer_corpus.jsonl, for the real Llama 3,
// Qwen3, GPT-2 and stories260K tokenizer.json files; plus decode checks.
#include <gtest/gtest.h>

#include "fusetune/tokenizers/hf_tokenizer.h"
#include "fusetune/tokenizers/unicode_normalize.h"
#include "tokenizer_reference.h"

namespace fusetune {
namespace {

using testing::printable;

struct Case {
  const char* name;
  const char* rel;  // tokenizer.json under the assets folder
  bool nfc;         // the normalizer is NFC: decode gives back the NFC form
  bool prepend;     // SentencePiece-style Prepend normalizer: pieces after an added token
                    // gain a space, so decode(encode(s)) == s only without added tokens
};

class HfConformance : public ::testing::TestWithParam<Case> {};

void check_against_reference(const Case& c, bool add_special_tokens) {
  const std::string impl = testing::reference_impl();
  const std::string why = testing::reference_unavailable(impl);
  if (!why.empty()) FT_SKIP_UNLESS_REQUIRED("tokenizer reference unavailable: " + why);
  const auto path = testing::assets_dir() / c.rel;
  testing::TempDir tmp;
  auto expected = testing::run_reference(path, testing::tokenizer_corpus(), tmp.path(),
                                         add_special_tokens, impl);
  ASSERT_GE(expected.size(), 300u) << "corpus too small";
  auto tok = testing::shared_hf_tokenizer(path);
  size_t id_mismatches = 0, decode_mismatches = 0, roundtrip_failures = 0;
  for (const auto& e : expected) {
    auto ids = add_special_tokens ? tok->encode_with_special_tokens(e.text)
                                  : tok->encode(e.text, false, false);
    if (ids != e.ids && ++id_mismatches <= 10)
      ADD_FAILURE() << c.name << " ids differ for " << printable(e.text)
                    << "\n  fusetune:  " << testing::ids_str(ids)
                    << "\n  reference: " << testing::ids_str(e.ids);
    // Decode the reference's ids, so a decode bug is not hidden by an encode bug.
    std::string d = tok->decode(e.ids, false), ds = tok->decode(e.ids, true);
    if ((d != e.decoded || ds != e.decoded_skip) && ++decode_mismatches <= 10)
      ADD_FAILURE() << c.name << " decode differs for ids of " << printable(e.text)
                    << "\n  fusetune:  " << printable(d) << " / skip " << printable(ds)
                    << "\n  reference: " << printable(e.decoded) << " / skip "
                    << printable(e.decoded_skip);
    if (!add_special_tokens) {
      std::string want = c.nfc ? unicode::normalize(e.text, unicode::NormalForm::NFC) : e.text;
      bool has_added = false;
      for (int32_t id : ids) has_added = has_added || tok->is_special(id);
      if ((!c.prepend || !has_added) && tok->decode(ids, false) != want &&
          ++roundtrip_failures <= 10)
        ADD_FAILURE() << c.name << " decode(encode(s)) != s for " << printable(e.text) << ": got "
                      << printable(tok->decode(ids, false));
    }
  }
  EXPECT_EQ(id_mismatches, 0u) << "of " << expected.size() << " strings (reference: " << impl
                               << ")";
  EXPECT_EQ(decode_mismatches, 0u);
  EXPECT_EQ(roundtrip_failures, 0u);
}

TEST_P(HfConformance, EncodeDecodeMatchReference) {
  FT_REQUIRE_ASSET(GetParam().rel);
  check_against_reference(GetParam(), false);
}

TEST_P(HfConformance, EncodeWithSpecialTokensMatchesReference) {
  FT_REQUIRE_ASSET(GetParam().rel);
  check_against_reference(GetParam(), true);
}

INSTANTIATE_TEST_SUITE_P(
    Assets, HfConformance,
    ::testing::Values(Case{"llama3", "tokenizers/llama3/tokenizer.json", false, false},
                      Case{"qwen3", "tokenizers/qwen3/tokenizer.json", true, false},
                      Case{"gpt2", "tokenizers/gpt2/tokenizer.json", false, false},
                      Case{"stories260K", "stories260K/tokenizer.json", false, true},
                      Case{"gemma3", "tokenizers/gemma3/tokenizer.json", false, false}),
    [](const auto& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace fusetune
