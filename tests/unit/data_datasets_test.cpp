// The dataset readers through build_dataset, on small files written here.
#include <gtest/gtest.h>

#include "checks.h"
#include "data_test_util.h"
#include "fusetune/data/collate.h"
#include "fusetune/data/dataset_factory.h"
#include "fusetune/data/datasets/instruct.h"
#include "fusetune/tokenizers/byte_tokenizer.h"
#include "fusetune/util/error.h"
#include "test_support.h"

namespace fusetune {
namespace {

using testing::error_of;
using testing::FakeTokenizer;
using testing::I;
using testing::L;
using testing::write_file;
using BT = ByteTokenizer;

// ---- text completion -------------------------------------------------------------------

TEST(DataDatasets, TextCompletionTxtAddsBosEosPerDocument) {
  testing::TempDir dir;
  DatasetOptions o;
  o.source = write_file(dir / "t.txt", "ab\n\ncd\n");
  BT tok;
  auto ds = build_dataset(o, tok);
  ASSERT_EQ(ds->size(), 2);
  EXPECT_EQ(ds->get(0).tokens, L({BT::kBos, "ab", BT::kEos}));
  EXPECT_EQ(ds->get(0).labels, ds->get(0).tokens);  // every token is a target
  EXPECT_EQ(ds->get(1).tokens, L({BT::kBos, "cd", BT::kEos}));
  EXPECT_EQ(ds->report().examples, 2);
  EXPECT_EQ(ds->report().tokens, 8);
}

TEST(DataDatasets, TextCompletionJsonlColumnAndTruncation) {
  testing::TempDir dir;
  DatasetOptions o;
  o.source = write_file(dir / "t.jsonl", "{\"body\": \"hello world\"}\n{\"body\": \"hi\"}\n");
  o.column = "body";
  o.max_seq_len = 5;
  BT tok;
  auto ds = build_dataset(o, tok);
  ASSERT_EQ(ds->size(), 2);
  EXPECT_EQ(ds->get(0).tokens, L({BT::kBos, "hell"}));  // cut, no EOS forced in
  EXPECT_EQ(ds->get(1).tokens, L({BT::kBos, "hi", BT::kEos}));
  EXPECT_EQ(ds->report().truncated, 1);
  o.column = "";
  o.column_map = {{"text", "body"}};
  EXPECT_EQ(build_dataset(o, tok)->size(), 2);
}

TEST(DataDatasets, TextCompletionPackedSplitsLongDocumentsWithoutTruncating) {
  testing::TempDir dir;
  DatasetOptions o;
  o.source = write_file(dir / "t.txt", "abcdefghij<|endoftext|>xyz");
  o.max_seq_len = 8;
  o.packed = true;
  BT tok;
  auto ds = build_dataset(o, tok);
  EXPECT_TRUE(ds->packed());
  // 12 + 5 tokens in rows of 8: [doc0 0..7], [doc0 8..11 | doc1 0..3], [doc1 4 | pad x7].
  ASSERT_EQ(ds->size(), 3);
  EXPECT_EQ(ds->report().truncated, 0);
  EXPECT_EQ(ds->get(0).tokens, L({BT::kBos, "abcdefg"}));
  EXPECT_EQ(ds->get(1).tokens, L({"hij", BT::kEos, BT::kBos, "xyz"}));
  EXPECT_EQ(ds->get(1).doc_ids, (std::vector<int32_t>{0, 0, 0, 0, 1, 1, 1, 1}));
  EXPECT_EQ(ds->get(2).tokens, (std::vector<int32_t>{BT::kEos, BT::kPad, BT::kPad, BT::kPad,
                                                     BT::kPad, BT::kPad, BT::kPad, BT::kPad}));
  EXPECT_EQ(ds->get(2).doc_ids, (std::vector<int32_t>{0, 1, 1, 1, 1, 1, 1, 1}));
  // Not packed: the same file is truncated to max_seq_len instead.
  o.packed = false;
  auto plain = build_dataset(o, tok);
  EXPECT_EQ(plain->get(0).tokens.size(), 8u);
  EXPECT_EQ(plain->report().truncated, 1);
}

// ---- pretokenized ----------------------------------------------------------------------

TEST(DataDatasets, PretokenizedReadsIdsAndOptionalLabels) {
  testing::TempDir dir;
  DatasetOptions o;
  o.kind = "pretokenized";
  o.source = write_file(dir / "p.jsonl",
                        "{\"input_ids\": [1, 2, 3]}\n"
                        "{\"input_ids\": [4, 5, 6], \"labels\": [-100, 5, 6]}\n");
  BT tok;
  auto ds = build_dataset(o, tok);
  ASSERT_EQ(ds->size(), 2);
  EXPECT_EQ(ds->get(0).labels, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(ds->get(1).labels, (std::vector<int32_t>{I, 5, 6}));
}

TEST(DataDatasets, PretokenizedValidatesIds) {
  testing::TempDir dir;
  DatasetOptions o;
  o.kind = "pretokenized";
  BT tok;
  o.source = write_file(dir / "p.jsonl", "{\"input_ids\": [1, 2]}\n{\"input_ids\": [1, 259]}\n");
  std::string m = error_of([&] { build_dataset(o, tok); });
  EXPECT_NE(m.find("p.jsonl line 2"), std::string::npos) << m;
  EXPECT_NE(m.find("259"), std::string::npos) << m;
  EXPECT_NE(m.find("vocab size 259"), std::string::npos) << m;
  o.source = write_file(dir / "q.jsonl", "{\"input_ids\": [1, 2], \"labels\": [1]}\n");
  EXPECT_NE(error_of([&] { build_dataset(o, tok); }).find("has 1 entries"), std::string::npos);
  o.source = write_file(dir / "r.jsonl", "{\"input_ids\": [1, \"x\"]}\n");
  EXPECT_NE(error_of([&] { build_dataset(o, tok); }).find("expected an integer"),
            std::string::npos);
  o.source = write_file(dir / "s.jsonl", "{\"input_ids\": [-100, 1]}\n");
  EXPECT_NE(error_of([&] { build_dataset(o, tok); }).find("-100"), std::string::npos);
}

// ---- alpaca / instruct -----------------------------------------------------------------

TEST(DataDatasets, AlpacaPromptTextIsTorchtunes) {
  EXPECT_EQ(datasets::alpaca_prompt("Add.", "1 and 2"),
            "Below is an instruction that describes a task, paired with an input that provides "
            "further context. Write a response that appropriately completes the request.\n\n"
            "### Instruction:\nAdd.\n\n### Input:\n1 and 2\n\n### Response:\n");
  EXPECT_EQ(datasets::alpaca_prompt("Say hi.", ""),
            "Below is an instruction that describes a task. Write a response that appropriately "
            "completes the request.\n\n### Instruction:\nSay hi.\n\n### Response:\n");
}

TEST(DataDatasets, AlpacaMasksPromptUnlessTrainOnInput) {
  testing::TempDir dir;
  DatasetOptions o;
  o.kind = "alpaca";
  o.source = write_file(dir / "a.json",
                        R"([{"instruction": "Add.", "input": "1 and 2", "output": "3"},
                            {"instruction": "Say hi.", "input": "", "output": "hi"}])");
  BT tok;
  auto ds = build_dataset(o, tok);
  ASSERT_EQ(ds->size(), 2);
  const std::string p0 = datasets::alpaca_prompt("Add.", "1 and 2");
  const Sample& s = ds->get(0);
  EXPECT_EQ(s.tokens, L({BT::kBos, p0, "3", BT::kEos}));
  std::vector<int32_t> want(1 + p0.size(), I);
  want.push_back('3');
  want.push_back(BT::kEos);
  EXPECT_EQ(s.labels, want);
  // After the collator's shift the first target is the response's first token, predicted
  // from the last prompt token.
  CollateOptions co;
  co.pad_mode = PadMode::kLongest;
  co.pad_id = BT::kPad;
  Batch b = collate({&s}, co);
  EXPECT_EQ(b.num_valid_labels(), 2);
  EXPECT_EQ(b.labels[p0.size()], '3');
  EXPECT_EQ(b.labels[p0.size() + 1], BT::kEos);
  EXPECT_EQ(ds->get(1).tokens,
            L({BT::kBos, datasets::alpaca_prompt("Say hi.", ""), "hi", BT::kEos}));

  o.train_on_input = true;
  auto all = build_dataset(o, tok);
  std::vector<int32_t> trained = all->get(0).tokens;
  trained[0] = I;  // BOS is never a target
  EXPECT_EQ(all->get(0).labels, trained);
}

TEST(DataDatasets, AlpacaUsesTheModelTemplateAndColumnMap) {
  testing::TempDir dir;
  DatasetOptions o;
  o.kind = "alpaca";
  o.source = write_file(dir / "a.jsonl", R"({"instruction": "Hi", "answer": "Yo"})");
  o.column_map = {{"output", "answer"}};
  o.model_family = "qwen2";
  FakeTokenizer tok;
  auto ds = build_dataset(o, tok);
  using T = FakeTokenizer;
  EXPECT_EQ(ds->get(0).tokens, L({T::kImStart, "user\n", datasets::alpaca_prompt("Hi", ""),
                                  T::kImEnd, "\n", T::kImStart, "assistant\nYo", T::kImEnd, "\n"}));
  o.column_map = {{"outptu", "answer"}};
  std::string m = error_of([&] { build_dataset(o, tok); });
  EXPECT_NE(m.find("did you mean 'output'"), std::string::npos) << m;
}

TEST(DataDatasets, InstructWithoutInstructionColumnIsInputOutput) {
  testing::TempDir dir;
  DatasetOptions o;
  o.kind = "instruct";
  o.source = write_file(dir / "a.jsonl", R"({"q": "2+2?", "a": "4"})");
  o.column_map = {{"input", "q"}, {"output", "a"}};
  o.new_system_prompt = "Math. ";
  BT tok;
  auto ds = build_dataset(o, tok);
  EXPECT_EQ(ds->get(0).tokens, L({BT::kBos, "Math. ", "2+2?", "4", BT::kEos}));
}

// ---- chat ------------------------------------------------------------------------------

TEST(DataDatasets, ChatOpenAIAndShareGPTGiveTheSameTokens) {
  testing::TempDir dir;
  FakeTokenizer tok;
  DatasetOptions o;
  o.kind = "chat";
  o.template_name = "llama3";
  o.source = write_file(
      dir / "oa.jsonl",
      R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}, {"role": "assistant", "content": [{"type": "text", "text": "A"}]}]})");
  auto a = build_dataset(o, tok);
  o.source = write_file(
      dir / "sg.json",
      R"([{"conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "U"}, {"from": "gpt", "value": "A"}]}])");
  auto b = build_dataset(o, tok);
  EXPECT_EQ(a->get(0).tokens, b->get(0).tokens);
  EXPECT_EQ(a->get(0).labels, b->get(0).labels);
  // Only the assistant content and its <|eot_id|> are targets.
  std::vector<int32_t> targets;
  for (int32_t l : a->get(0).labels)
    if (l != I) targets.push_back(l);
  EXPECT_EQ(targets, L({"A", FakeTokenizer::kEot}));
}

TEST(DataDatasets, ChatNewSystemPromptReplacesSystemMessages) {
  testing::TempDir dir;
  FakeTokenizer tok;
  DatasetOptions o;
  o.kind = "chat";
  o.template_name = "chatml";
  o.new_system_prompt = "NEW";
  o.source = write_file(
      dir / "c.jsonl",
      R"({"messages": [{"role": "system", "content": "OLD"}, {"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}]})");
  using T = FakeTokenizer;
  EXPECT_EQ(build_dataset(o, tok)->get(0).tokens,
            L({T::kImStart, "system\nNEW", T::kImEnd, "\n", T::kImStart, "user\nU", T::kImEnd, "\n",
               T::kImStart, "assistant\nA", T::kImEnd, "\n"}));
}

TEST(DataDatasets, ChatBadRoleAndStyleErrors) {
  testing::TempDir dir;
  FakeTokenizer tok;
  DatasetOptions o;
  o.kind = "chat";
  o.source = write_file(dir / "c.jsonl",
                        "{\"messages\": [{\"role\": \"user\", \"content\": \"U\"}, {\"role\": "
                        "\"asistant\", \"content\": \"A\"}]}\n");
  std::string m = error_of([&] { build_dataset(o, tok); });
  EXPECT_NE(m.find("c.jsonl line 1"), std::string::npos) << m;
  EXPECT_NE(m.find("did you mean 'assistant'"), std::string::npos) << m;
  o.conversation_style = "sharegtp";
  EXPECT_NE(error_of([&] { build_dataset(o, tok); }).find("conversation_style"), std::string::npos);
  o.conversation_style = "sharegpt";
  EXPECT_NE(error_of([&] { build_dataset(o, tok); }).find("missing column 'conversations'"),
            std::string::npos);
}

// ---- bad rows, skip, empty, split ------------------------------------------------------

TEST(DataDatasets, MalformedRowNamesFileLineAndProblem) {
  testing::TempDir dir;
  BT tok;
  DatasetOptions o;
  o.kind = "alpaca";
  o.source = write_file(dir / "bad.jsonl",
                        "{\"instruction\": \"a\", \"output\": \"b\"}\n"
                        "{\"instruction\": \"a\", \"outptu\": \"b\"}\n");
  std::string m = error_of([&] { build_dataset(o, tok); });
  EXPECT_NE(m.find("bad.jsonl line 2"), std::string::npos) << m;
  EXPECT_NE(m.find("missing column 'output'"), std::string::npos) << m;
  EXPECT_NE(m.find("did you mean 'outptu'"), std::string::npos) << m;
  EXPECT_NE(m.find("on_bad_row=skip"), std::string::npos) << m;

  o.source = write_file(dir / "bad.json", R"([{"instruction": "a", "output": "b"}, 7,
                                             {"instruction": "a", "output": 5}])");
  m = error_of([&] { build_dataset(o, tok); });
  EXPECT_NE(m.find("bad.json element [1]"), std::string::npos) << m;
  EXPECT_NE(m.find("expected a JSON object"), std::string::npos) << m;

  o.source = write_file(dir / "bad2.jsonl", "{\"instruction\": \"a\", \"output\": 5}\n");
  m = error_of([&] { build_dataset(o, tok); });
  EXPECT_NE(m.find("column 'output' is an integer, expected a string"), std::string::npos) << m;

  o.source = write_file(dir / "bad3.jsonl", "{\"instruction\": \"a\", \"output\": \"b\"}\n{oops\n");
  m = error_of([&] { build_dataset(o, tok); });
  EXPECT_NE(m.find("bad3.jsonl line 2: invalid JSON"), std::string::npos) << m;
}

TEST(DataDatasets, SkipModeCountsBadRows) {
  testing::TempDir dir;
  BT tok;
  DatasetOptions o;
  o.kind = "alpaca";
  o.on_bad_row = "skip";
  o.source = write_file(dir / "mixed.jsonl",
                        "{\"instruction\": \"a\", \"output\": \"b\"}\n"
                        "{not json}\n"
                        "{\"instruction\": \"a\"}\n"
                        "{\"instruction\": \"c\", \"output\": \"d\"}\n");
  auto ds = build_dataset(o, tok);
  EXPECT_EQ(ds->size(), 2);
  EXPECT_EQ(ds->report().rows_read, 4);
  EXPECT_EQ(ds->report().bad_rows_skipped, 2);
  EXPECT_NE(ds->report().first_bad_row.find("mixed.jsonl line 2"), std::string::npos);
  EXPECT_NE(ds->report().summary().find("2 bad rows skipped"), std::string::npos);
  o.on_bad_row = "ignore";
  EXPECT_NE(error_of([&] { build_dataset(o, tok); }).find("on_bad_row"), std::string::npos);
}

TEST(DataDatasets, EmptyDatasetIsAClearError) {
  testing::TempDir dir;
  BT tok;
  DatasetOptions o;
  o.source = write_file(dir / "empty.txt", "\n\n  \n");
  std::string m = error_of([&] { build_dataset(o, tok); });
  EXPECT_NE(m.find("has no examples after filtering"), std::string::npos) << m;
  EXPECT_NE(m.find("empty.txt"), std::string::npos) << m;

  // All rows bad and skipped.
  o.kind = "alpaca";
  o.on_bad_row = "skip";
  o.source = write_file(dir / "allbad.jsonl", "{\"x\": 1}\n{\"y\": 2}\n");
  m = error_of([&] { build_dataset(o, tok); });
  EXPECT_NE(m.find("has no examples after filtering"), std::string::npos) << m;
  EXPECT_NE(m.find("2 bad rows skipped"), std::string::npos) << m;

  // Prompts longer than max_seq_len leave nothing to train on.
  o.source = write_file(dir / "long.jsonl", "{\"instruction\": \"a\", \"output\": \"b\"}\n");
  o.max_seq_len = 20;
  m = error_of([&] { build_dataset(o, tok); });
  EXPECT_NE(m.find("without trained tokens"), std::string::npos) << m;
}

TEST(DataDatasets, SplitSlicesRowsBeforeFiltering) {
  testing::TempDir dir;
  BT tok;
  DatasetOptions o;
  o.kind = "pretokenized";
  std::string rows;
  for (int i = 0; i < 10; ++i) rows += "{\"input_ids\": [" + std::to_string(i) + ", 1]}\n";
  o.source = write_file(dir / "ten.jsonl", rows);
  o.split = "train[:80%]";
  auto head = build_dataset(o, tok);
  o.split = "train[80%:]";
  auto tail = build_dataset(o, tok);
  ASSERT_EQ(head->size(), 8);
  ASSERT_EQ(tail->size(), 2);
  EXPECT_EQ(tail->get(0).tokens[0], 8);
  EXPECT_EQ(tail->get(1).tokens[0], 9);
  o.split = "validation";
  EXPECT_NE(error_of([&] { build_dataset(o, tok); }).find("'train' split"), std::string::npos);
}

TEST(DataDatasets, FactoryRejectsUnknownKindAndFileType) {
  testing::TempDir dir;
  BT tok;
  DatasetOptions o;
  o.kind = "alpacca";
  o.source = write_file(dir / "x.json", "[]");
  EXPECT_NE(error_of([&] { build_dataset(o, tok); }).find("did you mean 'alpaca'"),
            std::string::npos);
  o.kind = "text_completion";
  o.source = write_file(dir / "x.csv", "a,b\n");
  EXPECT_NE(error_of([&] { build_dataset(o, tok); }).find("unsupported file type '.csv'"),
            std::string::npos);
  o.kind = "chat";
  o.source = write_file(dir / "x.txt", "hello");
  EXPECT_NE(error_of([&] { build_dataset(o, tok); }).find("not plain text"), std::string::npos);
  o.kind = "text_completion";
  o.source = "";
  EXPECT_NE(error_of([&] { build_dataset(o, tok); }).find("dataset.source is empty"),
            std::string::npos);
}

TEST(DataDatasets, PackedAlpacaStartsEachSampleInARowThatFits) {
  testing::TempDir dir;
  BT tok;
  DatasetOptions o;
  o.kind = "instruct";
  o.source = write_file(dir / "io.jsonl",
                        "{\"input\": \"aaaa\", \"output\": \"bb\"}\n"  // 1 + 4 + 2 + 1 = 8
                        "{\"input\": \"cc\", \"output\": \"d\"}\n"     // 5
                        "{\"input\": \"e\", \"output\": \"fff\"}\n");  // 6
  o.packed = true;
  o.max_seq_len = 12;
  auto ds = build_dataset(o, tok);
  ASSERT_EQ(ds->size(), 2);  // [8 | pad 4] would leave 4 < 5, so: [8 + pad], [5 + 6 + pad 1]
  EXPECT_EQ(ds->get(0).doc_ids, (std::vector<int32_t>{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1}));
  EXPECT_EQ(ds->get(1).doc_ids, (std::vector<int32_t>{0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2}));
  EXPECT_EQ(ds->get(0).tokens.back(), BT::kPad);
}

}  // namespace
}  // namespace fusetune
