#include "fusetune/data/chat_format.h"

#include <gtest/gtest.h>

#include "data_test_util.h"
#include "fusetune/tokenizers/byte_tokenizer.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

using testing::FakeTokenizer;
using testing::Piece;
using Fake = FakeTokenizer;

// Expected layout: segments that are either all targets (true) or all masked (false).
Sample expect(std::initializer_list<std::pair<Piece, bool>> segs) {
  Sample s;
  for (const auto& [piece, trained] : segs)
    for (int32_t id : piece.ids) {
      s.tokens.push_back(id);
      s.labels.push_back(trained ? id : kIgnoreIndex);
    }
  return s;
}

std::vector<Message> conversation() {
  return {{Role::kSystem, "Be brief.", false},
          {Role::kUser, "Hi", false},
          {Role::kAssistant, " Hello! ", true},
          {Role::kUser, "Bye", false},
          {Role::kAssistant, "Ciao", true}};
}

void expect_same(const Sample& got, const Sample& want) {
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.labels, want.labels);
}

TEST(DataChatFormat, Llama3Layout) {
  Fake tok;
  auto f = make_chat_format("llama3", tok);
  Sample want = expect({{Fake::kBegin, false}, {Fake::kStartHeader, false},
                        {"system", false},     {Fake::kEndHeader, false},
                        {"\n\n", false},       {"Be brief.", false},
                        {Fake::kEot, false},   {Fake::kStartHeader, false},
                        {"user", false},       {Fake::kEndHeader, false},
                        {"\n\n", false},       {"Hi", false},
                        {Fake::kEot, false},   {Fake::kStartHeader, false},
                        {"assistant", false},  {Fake::kEndHeader, false},
                        {"\n\n", false},       {"Hello!", true},
                        {Fake::kEot, true},    {Fake::kStartHeader, false},
                        {"user", false},       {Fake::kEndHeader, false},
                        {"\n\n", false},       {"Bye", false},
                        {Fake::kEot, false},   {Fake::kStartHeader, false},
                        {"assistant", false},  {Fake::kEndHeader, false},
                        {"\n\n", false},       {"Ciao", true},
                        {Fake::kEot, true}});
  expect_same(f->render(conversation()), want);
}

TEST(DataChatFormat, ChatMLLayout) {
  Fake tok;
  auto f = make_chat_format("chatml", tok);
  Sample want = expect({{Fake::kImStart, false},
                        {"system\n", false},
                        {"Be brief.", false},
                        {Fake::kImEnd, false},
                        {"\n", false},
                        {Fake::kImStart, false},
                        {"user\n", false},
                        {"Hi", false},
                        {Fake::kImEnd, false},
                        {"\n", false},
                        {Fake::kImStart, false},
                        {"assistant\n", false},
                        {" Hello! ", true},
                        {Fake::kImEnd, true},
                        {"\n", false},
                        {Fake::kImStart, false},
                        {"user\n", false},
                        {"Bye", false},
                        {Fake::kImEnd, false},
                        {"\n", false},
                        {Fake::kImStart, false},
                        {"assistant\n", false},
                        {"Ciao", true},
                        {Fake::kImEnd, true},
                        {"\n", false}});
  expect_same(f->render(conversation()), want);
}

// Gemma: BOS, turns as user/model, the system text ahead of the first user turn's content.
TEST(DataChatFormat, GemmaLayout) {
  Fake tok(false, false, true, /*gemma=*/true);
  auto f = make_chat_format("gemma", tok);
  Sample want = expect({{Fake::kBos, false},
                        {Fake::kStartOfTurn, false},
                        {"user\n", false},
                        {"Be brief.\n\n", false},
                        {"Hi", false},
                        {Fake::kEndOfTurn, false},
                        {"\n", false},
                        {Fake::kStartOfTurn, false},
                        {"model\n", false},
                        {"Hello!", true},
                        {Fake::kEndOfTurn, true},
                        {"\n", false},
                        {Fake::kStartOfTurn, false},
                        {"user\n", false},
                        {"Bye", false},
                        {Fake::kEndOfTurn, false},
                        {"\n", false},
                        {Fake::kStartOfTurn, false},
                        {"model\n", false},
                        {"Ciao", true},
                        {Fake::kEndOfTurn, true},
                        {"\n", false}});
  expect_same(f->render(conversation()), want);
  const std::vector<Message> ask = {{Role::kUser, "Hi", false}};
  Sample prompt = f->render_prompt(ask);
  Sample open = expect({{Fake::kBos, false},
                        {Fake::kStartOfTurn, false},
                        {"user\nHi", false},
                        {Fake::kEndOfTurn, false},
                        {"\n", false},
                        {Fake::kStartOfTurn, false},
                        {"model\n", false}});
  expect_same(prompt, open);
  EXPECT_EQ(f->end_of_turn_tokens(), std::vector<int32_t>{Fake::kEndOfTurn});
  EXPECT_THROW(f->render({{Role::kAssistant, "x", true}}), Error);  // a user turn first
  EXPECT_EQ(resolve_chat_format("auto", "gemma", tok), "gemma");
  EXPECT_EQ(resolve_chat_format("auto", "", tok), "gemma");
  EXPECT_THROW(make_chat_format("gemma", Fake()), Error);  // no <start_of_turn>
}

TEST(DataChatFormat, Llama2Layout) {
  Fake tok;
  auto f = make_chat_format("llama2", tok);
  Sample want = expect({{Fake::kBos, false},
                        {"[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]", false},
                        {" Hello! ", true},
                        {Fake::kEos, true},
                        {Fake::kBos, false},
                        {"[INST] Bye [/INST]", false},
                        {" Ciao ", true},
                        {Fake::kEos, true}});
  expect_same(f->render(conversation()), want);
}

TEST(DataChatFormat, MistralLayout) {
  Fake tok;
  auto f = make_chat_format("mistral", tok);
  Sample want = expect({{Fake::kBos, false},
                        {"[INST] Be brief.\n\nHi [/INST]", false},
                        {" Hello! ", true},
                        {Fake::kEos, true},
                        {"[INST] Bye [/INST]", false},
                        {"Ciao", true},
                        {Fake::kEos, true}});
  expect_same(f->render(conversation()), want);
}

TEST(DataChatFormat, PlainLayout) {
  Fake tok;
  auto f = make_chat_format("plain", tok);
  std::vector<Message> m = {{Role::kUser, "Q: 2+2?\n", false}, {Role::kAssistant, "4", true}};
  expect_same(f->render(m),
              expect({{Fake::kBos, false}, {"Q: 2+2?\n", false}, {"4", true}, {Fake::kEos, true}}));
  // A tokenizer without BOS (Qwen-like) gets none.
  Fake no_bos(true, true, /*has_bos=*/false);
  expect_same(make_chat_format("alpaca", no_bos)->render(m),
              expect({{"Q: 2+2?\n", false}, {"4", true}, {Fake::kEos, true}}));
}

TEST(DataChatFormat, TrainOnInputUnmasksUserContentButNotHeaders) {
  Fake tok;
  std::vector<Message> m = {{Role::kUser, "Hi", true}, {Role::kAssistant, "Yo", true}};
  Sample want = expect({{Fake::kBegin, false},
                        {Fake::kStartHeader, false},
                        {"user", false},
                        {Fake::kEndHeader, false},
                        {"\n\n", false},
                        {"Hi", true},
                        {Fake::kEot, true},
                        {Fake::kStartHeader, false},
                        {"assistant", false},
                        {Fake::kEndHeader, false},
                        {"\n\n", false},
                        {"Yo", true},
                        {Fake::kEot, true}});
  expect_same(make_chat_format("llama3", tok)->render(m), want);
}

TEST(DataChatFormat, Llama2RequiresAlternation) {
  Fake tok;
  std::vector<Message> m = {{Role::kUser, "a", false}, {Role::kUser, "b", false}};
  EXPECT_THROW(make_chat_format("llama2", tok)->render(m), Error);
}

TEST(DataChatFormat, MissingSpecialTokenIsNamed) {
  ByteTokenizer bytes;
  try {
    make_chat_format("llama3", bytes);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("<|begin_of_text|>"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_chat_format("chatml", bytes), Error);
  EXPECT_NO_THROW(make_chat_format("llama2", bytes));  // uses BOS/EOS ids only
}

TEST(DataChatFormat, UnknownNameSuggests) {
  Fake tok;
  try {
    make_chat_format("lama3", tok);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'llama3'"), std::string::npos) << e.what();
  }
}

TEST(DataChatFormat, ResolveByTemplateFamilyThenTokenizer) {
  Fake both;
  Fake chatml_only(/*llama3=*/false, /*chatml=*/true);
  Fake none(false, false);
  ByteTokenizer bytes;
  EXPECT_EQ(resolve_chat_format("llama2", "llama3", both), "llama2");  // explicit wins
  EXPECT_EQ(resolve_chat_format("auto", "llama3_1", none), "llama3");
  EXPECT_EQ(resolve_chat_format("", "Llama-3.2", none), "llama3");
  EXPECT_EQ(resolve_chat_format("auto", "qwen2", none), "chatml");
  EXPECT_EQ(resolve_chat_format("auto", "llama2", none), "llama2");
  EXPECT_EQ(resolve_chat_format("auto", "mistral", none), "mistral");
  EXPECT_EQ(resolve_chat_format("auto", "", both), "llama3");
  EXPECT_EQ(resolve_chat_format("auto", "", chatml_only), "chatml");
  EXPECT_EQ(resolve_chat_format("auto", "", none), "plain");
  EXPECT_EQ(resolve_chat_format("auto", "", bytes), "plain");
}

}  // namespace
}  // namespace fusetune

namespace fusetune {
namespace {

// A generation prompt: the conversation, then what opens the assistant's answer.
TEST(DataChatFormat, GenerationPromptsOpenTheAnswer) {
  Fake tok;
  const std::vector<Message> ask{{Role::kSystem, "Be brief.", false}, {Role::kUser, "Hi", false}};
  auto llama3 = make_chat_format("llama3", tok);
  Sample want = llama3->render(ask);
  for (int32_t id : expect({{Fake::kStartHeader, false},
                            {"assistant", false},
                            {Fake::kEndHeader, false},
                            {"\n\n", false}})
                        .tokens)
    want.tokens.push_back(id);
  EXPECT_EQ(llama3->render_prompt(ask).tokens, want.tokens);
  EXPECT_EQ(llama3->end_of_turn_tokens(), expect({{Fake::kEot, false}}).tokens);

  auto chatml = make_chat_format("chatml", tok);
  want = chatml->render(ask);
  for (int32_t id : expect({{Fake::kImStart, false}, {"assistant\n", false}}).tokens)
    want.tokens.push_back(id);
  EXPECT_EQ(chatml->render_prompt(ask).tokens, want.tokens);
  EXPECT_EQ(chatml->end_of_turn_tokens(), expect({{Fake::kImEnd, false}}).tokens);

  // [INST] formats end the prompt at [/INST]; plain adds nothing.
  auto llama2 = make_chat_format("llama2", tok);
  EXPECT_EQ(llama2->render_prompt(ask).tokens, llama2->render(ask).tokens);
  ByteTokenizer bytes;
  auto plain = make_chat_format("plain", bytes);
  EXPECT_EQ(plain->render_prompt({{Role::kUser, "Hi", false}}).tokens,
            (std::vector<int32_t>{ByteTokenizer::kBos, 'H', 'i'}));
}

}  // namespace
}  // namespace fusetune
