// The tokenizer section: torchtune's tokenizer builders as components, and every key they take
// either honoured or refused with the reason.
#include <gtest/gtest.h>

#include "checks.h"
#include "fusetune/config/components.h"
#include "fusetune/config/recipe_schemas.h"
#include "fusetune/config/schema.h"
#include "fusetune/util/error.h"
#include "tiny_llama.h"

using namespace fusetune;
using fusetune::testing::contains;
using fusetune::testing::error_of;

namespace {

const std::string kBase = fusetune::testing::tiny_config_yaml("tokenizer:\n  _component_: byte\n");

Config with_tokenizer(const std::string& tokenizer_yaml) {
  Config c = Config::from_string(kBase, "configs/t.yaml");
  c.apply_overrides({"tokenizer=" + tokenizer_yaml});
  return c;
}

std::string tokenizer_problems(const std::string& tokenizer_yaml) {
  return error_of([&] { validate(with_tokenizer(tokenizer_yaml), full_finetune_schema()); });
}

TEST(ConfigTokenizer, TorchtuneBuildersAreComponents) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{_component_: torchtune.models.llama3.llama3_tokenizer, path: "
       "/m/original/tokenizer.model, max_seq_len: null}",
       "llama3"},
      {"{_component_: torchtune.models.llama3.llama3_tokenizer, path: /m/original/tokenizer.model, "
       "special_tokens_path: /m/tokenizer.json, prompt_template: null, truncation_type: right}",
       "llama3"},
      {"{_component_: torchtune.models.qwen2_5.qwen2_5_tokenizer, path: /m/vocab.json, "
       "merges_file: /m/merges.txt, max_seq_len: null}",
       "qwen2_5"},
      {"{_component_: torchtune.models.qwen2.qwen2_tokenizer, path: /m/vocab.json, merges_file: "
       "/m/merges.txt, eos_token: <|endoftext|>, pad_token: null, errors: replace}",
       "qwen2"},
      {"{_component_: torchtune.models.qwen3.qwen3_tokenizer, path: /m/vocab.json, merges_file: "
       "/m/merges.txt, max_seq_len: null}",
       "qwen3"},
      {"{_component_: torchtune.models.llama2.llama2_tokenizer, path: /m/tokenizer.model}",
       "sentencepiece"},
      {"{_component_: torchtune.models.mistral.mistral_tokenizer, path: /m/tokenizer.model, "
       "prompt_template: torchtune.models.mistral.MistralChatTemplate}",
       "sentencepiece"},
      {"{_component_: torchtune.models.gemma.gemma_tokenizer, path: /m/tokenizer.model}",
       "sentencepiece"},
      {"{_component_: torchtune.models.phi3.phi3_mini_tokenizer, path: /m/tokenizer.model, "
       "max_seq_len: null}",
       "phi3_mini"},
      {"{_component_: torchtune.models.phi4.phi4_tokenizer, vocab_path: /m/vocab.json, "
       "merges_path: /m/merges.txt, max_seq_len: null}",
       "phi4"},
      {"{_component_: hf, path: /m/tokenizer.json}", "hf"}};
  for (const auto& [yaml, comp] : cases) {
    EXPECT_EQ(tokenizer_problems(yaml), "") << yaml;
    EXPECT_EQ(canonical_component(with_tokenizer(yaml), "tokenizer"), comp) << yaml;
  }
}

TEST(ConfigTokenizer, UnsupportedKeysAreRefusedWithTheReason) {
  std::string msg = tokenizer_problems(
      "{_component_: torchtune.models.llama3.llama3_tokenizer, path: /m/t.model, "
      "prompt_template: torchtune.data.AlpacaInstructTemplate}");
  EXPECT_TRUE(contains(msg,
                       "'tokenizer.prompt_template' is not supported: fusetune does not apply "
                       "a tokenizer-level prompt template"))
      << msg;
  msg = tokenizer_problems(
      "{_component_: torchtune.models.llama3.llama3_tokenizer, path: /m/t.model, "
      "truncation_type: left}");
  EXPECT_TRUE(contains(msg, "'tokenizer.truncation_type' is not supported: left truncation"))
      << msg;
  msg = tokenizer_problems(
      "{_component_: torchtune.models.llama3.llama3_tokenizer, path: /m/t.model, "
      "truncation_type: middle}");
  EXPECT_TRUE(contains(msg, "must be right (or left, which is not supported), got 'middle'"))
      << msg;
  msg = tokenizer_problems(
      "{_component_: torchtune.models.qwen2_5.qwen2_5_tokenizer, path: /m/vocab.json, "
      "merges_file: /m/merges.txt, bpe_cache_size: 100, errors: strict}");
  EXPECT_TRUE(contains(msg, "'tokenizer.bpe_cache_size' is not supported")) << msg;
  EXPECT_TRUE(contains(msg, "'tokenizer.errors' is not supported")) << msg;
  msg = tokenizer_problems(
      "{_component_: torchtune.models.llama2.llama2_tokenizer, path: /m/tokenizer.model, "
      "prompt_template: null}");
  EXPECT_TRUE(contains(msg,
                       "null (no template) differs from "
                       "torchtune.models.llama2.Llama2ChatTemplate"))
      << msg;
  msg = tokenizer_problems(
      "{_component_: torchtune.models.llama2.llama2_tokenizer, path: /m/tokenizer.model, "
      "prompt_template: torchtune.models.mistral.MistralChatTemplate}");
  EXPECT_TRUE(contains(msg, "'tokenizer.prompt_template' is not supported")) << msg;
}

TEST(ConfigTokenizer, KeysOfOtherFormatsAreErrors) {
  std::string msg = tokenizer_problems(
      "{_component_: torchtune.models.qwen2_5.qwen2_5_tokenizer, path: /m/vocab.json}");
  EXPECT_TRUE(contains(msg, "a vocab.json, which needs 'tokenizer.merges_file'")) << msg;
  msg =
      tokenizer_problems("{_component_: hf, path: /m/tokenizer.json, merges_file: /m/merges.txt}");
  EXPECT_TRUE(contains(msg, "'tokenizer.merges_file' is not valid with tokenizer._component_ hf"))
      << msg;
  msg = tokenizer_problems(
      "{_component_: torchtune.models.llama3.llama3_tokenizer, path: /m/t.model, "
      "merges_file: /m/merges.txt}");
  EXPECT_TRUE(contains(msg,
                       "'tokenizer.merges_file' is not valid with tokenizer._component_ "
                       "llama3"))
      << msg;
  msg = tokenizer_problems("{_component_: hf, path: /m/vocab.json}");
  EXPECT_TRUE(contains(msg, "qwen2_5_tokenizer with merges_file")) << msg;
  msg = tokenizer_problems("{_component_: hf, path: /m/original/tokenizer.model}");
  EXPECT_TRUE(contains(msg, "torchtune.models.llama3.llama3_tokenizer")) << msg;
}

}  // namespace
