// HfTokenizer against recorded ids that need no reference implementation: stories260K's
// golden encodings (from llama2.c's run.c) and a few published Llama 3 / Qwen3 / GPT-2 ids.
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fusetune/tokenizers/hf_tokenizer.h"
#include "fusetune/tokenizers/load_tokenizer.h"
#include "tokenizer_reference.h"

namespace fusetune {
namespace {

TEST(HfGolden, Stories260KMatchesLlama2cEncoder) {
  FT_REQUIRE_ASSET("stories260K/golden.json");
  FT_REQUIRE_ASSET("stories260K/tokenizer.json");
  std::ifstream in(testing::assets_dir() / "stories260K/golden.json");
  auto golden = nlohmann::json::parse(in).at("encode_with_bos");
  ASSERT_FALSE(golden.empty());
  auto tok = load_tokenizer("auto", testing::assets_dir() / "stories260K");
  auto* hf = dynamic_cast<HfTokenizer*>(tok.get());
  ASSERT_NE(hf, nullptr);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_EQ(tok->vocab_size(), 512);
  EXPECT_TRUE(tok->default_add_bos());
  for (auto it = golden.begin(); it != golden.end(); ++it) {
    auto want = it.value().get<std::vector<int32_t>>();
    EXPECT_EQ(tok->encode(it.key(), true, false), want) << it.key();
    EXPECT_EQ(hf->encode_with_special_tokens(it.key()), want) << it.key();
    EXPECT_EQ(tok->decode(want, true), it.key());
  }
}

TEST(HfGolden, Llama3KnownIds) {
  FT_REQUIRE_ASSET("tokenizers/llama3/tokenizer.json");
  auto tok =
      testing::shared_hf_tokenizer(testing::assets_dir() / "tokenizers/llama3/tokenizer.json");
  EXPECT_EQ(tok->vocab_size(), 128256);
  EXPECT_EQ(tok->bos_id(), 128000);  // <|begin_of_text|>, from tokenizer_config.json
  EXPECT_EQ(tok->eos_id(), 128001);
  EXPECT_EQ(tok->token_to_id("<|eot_id|>"), 128009);
  EXPECT_EQ(tok->encode("Hello world", true, false), (std::vector<int32_t>{128000, 9906, 1917}));
  EXPECT_EQ(tok->encode("<|start_header_id|>user<|end_header_id|>\n\n", false, false),
            (std::vector<int32_t>{128006, 882, 128007, 271}));
  EXPECT_EQ(tok->decode({128000, 9906, 1917, 128009}, true), "Hello world");
}

TEST(HfGolden, Qwen3AndGpt2KnownIds) {
  FT_REQUIRE_ASSET("tokenizers/qwen3/tokenizer.json");
  FT_REQUIRE_ASSET("tokenizers/gpt2/tokenizer.json");
  auto qwen =
      testing::shared_hf_tokenizer(testing::assets_dir() / "tokenizers/qwen3/tokenizer.json");
  EXPECT_EQ(qwen->bos_id(), -1);      // Qwen has no BOS
  EXPECT_EQ(qwen->eos_id(), 151645);  // <|im_end|>
  EXPECT_EQ(qwen->pad_id(), 151643);  // <|endoftext|>
  EXPECT_EQ(qwen->encode("Hello world", true, false), (std::vector<int32_t>{9707, 1879}));
  // NFC: a decomposed é encodes like the precomposed one.
  EXPECT_EQ(qwen->encode("e\xCC\x81", false, false), qwen->encode("\xC3\xA9", false, false));
  auto gpt2 =
      testing::shared_hf_tokenizer(testing::assets_dir() / "tokenizers/gpt2/tokenizer.json");
  EXPECT_EQ(gpt2->encode("Hello world", false, false), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(gpt2->eos_id(), 50256);
}

}  // namespace
}  // namespace fusetune
