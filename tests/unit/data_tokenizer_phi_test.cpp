// torchtune's phi3_mini_tokenizer and phi4_tokenizer, and the Phi-3 / Phi-4 chat formats. The
// assets hold no Phi tokenizer: Llama 2's tokenizer.model (Phi-3's own SentencePiece model
// is Llama 2's) and GPT-2's byte-level BPE (written as vocab.json + merges.txt) stand in.
#include "fusetune/tokenizers/phi_tokenizers.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "bpe_files.h"
#include "fusetune/data/chat_format.h"
#include "fusetune/tokenizers/load_tokenizer.h"
#include "fusetune/util/error.h"
#include "test_support.h"

namespace fusetune {
namespace {

const char* const kLlama2Model = "tokenizers/llama2/tokenizer.model";
const char* const kGpt2Json = "tokenizers/gpt2/tokenizer.json";

std::unique_ptr<Tokenizer> phi3() {
  TokenizerSpec s;
  s.type = "phi3_mini";
  s.path = testing::assets_dir() / kLlama2Model;
  return load_tokenizer(s);
}

// GPT-2's tokenizer.json as vocab.json + merges.txt in `dir`, loaded as Phi-4's tokenizer.
std::unique_ptr<Tokenizer> phi4(const testing::TempDir& dir) {
  testing::write_vocab_and_merges(testing::assets_dir() / kGpt2Json, dir.path());
  TokenizerSpec s;
  s.type = "phi4";
  s.path = dir / "vocab.json";
  s.merges_file = dir / "merges.txt";
  return load_tokenizer(s);
}

std::vector<int32_t> cat(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

}  // namespace

TEST(PhiTokenizers, Phi3AddsItsTokensToLlama2sPieces) {
  FT_REQUIRE_ASSET(kLlama2Model);
  auto tok = phi3();
  EXPECT_EQ(tok->vocab_size(), 32011);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 32000);
  EXPECT_EQ(tok->pad_id(), 32000);
  EXPECT_EQ(tok->token_to_id("<|endoftext|>"), 32000);
  EXPECT_EQ(tok->token_to_id("<|assistant|>"), 32001);
  EXPECT_EQ(tok->token_to_id("<|system|>"), 32006);
  EXPECT_EQ(tok->token_to_id("<|end|>"), 32007);
  EXPECT_EQ(tok->token_to_id("<|user|>"), 32010);
  EXPECT_EQ(tok->token_to_id("<s>"), 1);
  // Text is SentencePiece's alone (torchtune's Phi3MiniTokenizer.encode); EOS is <|endoftext|>.
  TokenizerSpec s;
  s.type = "sentencepiece";
  s.path = testing::assets_dir() / kLlama2Model;
  const auto llama2 = load_tokenizer(s);
  const std::string text = "Hello world, Phi-3!";
  std::vector<int32_t> ids = llama2->encode(text, true, false);
  ids.push_back(32000);
  EXPECT_EQ(tok->encode(text, true, true), ids);
  // Added tokens decode to their text, or are dropped.
  ids.insert(ids.begin() + 1, 32010);
  EXPECT_EQ(tok->decode(ids, true), text);
  EXPECT_EQ(tok->decode(ids, false), "<s><|user|>" + text + "<|endoftext|>");
}

TEST(PhiTokenizers, Phi4HasItsSpecialTokensAndCl100kDigits) {
  FT_REQUIRE_ASSET(kGpt2Json);
  testing::TempDir dir;
  auto tok = phi4(dir);
  EXPECT_EQ(tok->token_to_id("<|endoftext|>"), 100257);
  EXPECT_EQ(tok->token_to_id("<|im_start|>"), 100264);
  EXPECT_EQ(tok->token_to_id("<|im_end|>"), 100265);
  EXPECT_EQ(tok->token_to_id("<|im_sep|>"), 100266);
  EXPECT_EQ(tok->token_to_id("<|endofprompt|>"), 100276);
  EXPECT_EQ(tok->token_to_id("<|dummy_4|>"), 100267);
  EXPECT_EQ(tok->token_to_id("<|dummy_85|>"), 100349);
  EXPECT_EQ(tok->token_to_id("<|dummy_87|>"), 100351);
  EXPECT_EQ(phi4_special_tokens().size(), 96u);
  EXPECT_EQ(tok->bos_id(), 100257);
  EXPECT_EQ(tok->eos_id(), 100265);
  EXPECT_EQ(tok->pad_id(), 100349);
  // cl100k's split: digits in runs of at most three ("12345" is "123" then "45").
  const auto digits = tok->encode("12345", false, false);
  EXPECT_EQ(digits, cat({tok->encode("123", false, false), tok->encode("45", false, false)}));
  EXPECT_EQ(tok->decode(digits, true), "12345");
  // Special tokens written in the text are found, and BOS / EOS added by default.
  const auto ids = tok->encode("<|im_start|>hi", true, true);
  EXPECT_EQ(ids.front(), 100257);
  EXPECT_EQ(ids[1], 100264);
  EXPECT_EQ(ids.back(), 100265);
}

TEST(PhiTokenizers, Phi3ChatFormat) {
  FT_REQUIRE_ASSET(kLlama2Model);
  auto tok = phi3();
  EXPECT_EQ(resolve_chat_format("auto", "phi3", *tok), "phi3");
  auto f = make_chat_format("phi3", *tok);
  const Sample s = f->render({{Role::kSystem, "Be brief.", false},
                              {Role::kUser, "Hi", false},
                              {Role::kAssistant, "Hello!", true}});
  auto enc = [&](const char* t) { return tok->encode(t, false, false); };
  const std::vector<int32_t> want = cat({{1, 32006},
                                         enc("\n"),
                                         enc("Be brief."),
                                         {32007},
                                         enc("\n"),
                                         {32010},
                                         enc("\n"),
                                         enc("Hi"),
                                         {32007},
                                         enc("\n"),
                                         {32001},
                                         enc("\n"),
                                         enc("Hello!"),
                                         {32007},
                                         enc("\n")});
  EXPECT_EQ(s.tokens, want);
  // Only the assistant's content and its <|end|> are trained.
  std::vector<int32_t> trained;
  for (int32_t l : s.labels)
    if (l != kIgnoreIndex) trained.push_back(l);
  EXPECT_EQ(trained, cat({enc("Hello!"), {32007}}));
  const Sample p = f->render_prompt({{Role::kUser, "Hi", false}});
  EXPECT_EQ(p.tokens,
            cat({{1, 32010}, enc("\n"), enc("Hi"), {32007}, enc("\n"), {32001}, enc("\n")}));
  EXPECT_EQ(f->end_of_turn_tokens(), (std::vector<int32_t>{32007, 32000}));
}

TEST(PhiTokenizers, Phi4ChatFormat) {
  FT_REQUIRE_ASSET(kGpt2Json);
  testing::TempDir dir;
  auto tok = phi4(dir);
  EXPECT_EQ(resolve_chat_format("auto", "phi3", *tok), "phi4");  // Phi-4 is model_type phi3
  auto f = make_chat_format("phi4", *tok);
  const Sample s = f->render({{Role::kUser, "Hi", false}, {Role::kAssistant, "Hello!", true}});
  auto enc = [&](const char* t) { return tok->encode(t, false, false); };
  EXPECT_EQ(s.tokens, cat({{100264},
                           enc("user"),
                           {100266},
                           enc("Hi"),
                           {100265},
                           {100264},
                           enc("assistant"),
                           {100266},
                           enc("Hello!"),
                           {100265}}));
  EXPECT_EQ(f->end_of_turn_tokens(), (std::vector<int32_t>{100265}));
}

TEST(PhiTokenizers, Phi4NeedsBothFiles) {
  TokenizerSpec s;
  s.type = "phi4";
  s.path = "/nonexistent/vocab.json";
  try {
    load_tokenizer(s);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs vocab_path (vocab.json) and merges_path"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace fusetune
