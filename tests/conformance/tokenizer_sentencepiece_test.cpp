// SentencePieceTokenizer on Meta's Llama 2 tokenizer.model: published ids, special-token text,
// and decode(encode(s)) == s over the tokenizer corpus.
#include <gtest/gtest.h>

#include "fusetune/tokenizers/load_tokenizer.h"
#include "fusetune/tokenizers/sentencepiece_tokenizer.h"
#include "tokenizer_reference.h"

namespace fusetune {
namespace {

constexpr const char* kModel = "tokenizers/llama2/tokenizer.model";

TEST(SentencePieceLlama2, KnownIdsAndSpecialTokens) {
  FT_REQUIRE_ASSET(kModel);
  auto tok = SentencePieceTokenizer::from_file(testing::assets_dir() / kModel);
  EXPECT_EQ(tok->vocab_size(), 32000);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_EQ(tok->pad_id(), 2);  // Llama 2 has no pad piece: EOS
  // Llama 2's well-known ids: "Hello world" = ▁Hello ▁world; a newline is a byte piece.
  EXPECT_EQ(tok->encode("Hello world", true, false), (std::vector<int32_t>{1, 15043, 3186}));
  EXPECT_EQ(tok->encode("Hello world", true, true), (std::vector<int32_t>{1, 15043, 3186, 2}));
  EXPECT_EQ(tok->encode("\n", false, false), (std::vector<int32_t>{29871, 13}));
  EXPECT_EQ(tok->token_to_id("<0x0A>"), 13);
  EXPECT_EQ(tok->token_to_id("\xE2\x96\x81Hello"), 15043);
  EXPECT_EQ(tok->token_to_id("<unk>"), 0);
  EXPECT_EQ(tok->token_to_id("no-such-piece-xyz"), std::nullopt);
  // <s> / </s> written in the text are the control tokens, as in Hugging Face.
  EXPECT_EQ(tok->encode("<s>Hi</s>", false, false), (std::vector<int32_t>{1, 6324, 2}));
  EXPECT_EQ(tok->decode({1, 15043, 3186, 2}, true), "Hello world");
  EXPECT_EQ(tok->decode({1, 15043, 3186, 2}, false), "<s>Hello world</s>");
  EXPECT_EQ(tok->decode({15043, 99999, -1, 3186}, false), "Hello world");  // bad ids skipped
  // Byte fallback: an emoji is four byte pieces, and decodes back.
  auto ids = tok->encode("\xF0\x9F\x98\x80", false, false);
  EXPECT_EQ(tok->decode(ids, false), "\xF0\x9F\x98\x80");
}

TEST(SentencePieceLlama2, LoadedThroughLoadTokenizer) {
  FT_REQUIRE_ASSET(kModel);
  auto dir = (testing::assets_dir() / kModel).parent_path();
  for (const char* type : {"sentencepiece", "auto"}) {
    auto tok = load_tokenizer(type, dir);
    ASSERT_NE(dynamic_cast<SentencePieceTokenizer*>(tok.get()), nullptr) << type;
  }
}

TEST(SentencePieceLlama2, DecodeEncodeRoundTripsOnCorpus) {
  FT_REQUIRE_ASSET(kModel);
  auto tok = SentencePieceTokenizer::from_file(testing::assets_dir() / kModel);
  auto corpus = testing::read_corpus(testing::tokenizer_corpus());
  ASSERT_GE(corpus.size(), 300u);
  size_t failures = 0, checked = 0;
  for (const auto& s : corpus) {
    // Special-token text is encoded as the special id and decoded without SentencePiece's
    // dummy-prefix handling around it; those strings are checked above.
    if (s.find("<s>") != std::string::npos || s.find("</s>") != std::string::npos ||
        s.find("<unk>") != std::string::npos)
      continue;
    ++checked;
    std::string back = tok->decode(tok->encode(s, true, true), true);
    if (back != s && ++failures <= 10)
      ADD_FAILURE() << "decode(encode(s)) != s for " << testing::printable(s) << ": got "
                    << testing::printable(back);
  }
  EXPECT_EQ(failures, 0u) << "of " << checked << " strings";
}

}  // namespace
}  // namespace fusetune
