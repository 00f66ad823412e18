#include "fusetune/data/datasets/preference.h"

#include <gtest/gtest.h>

#include "fusetune/data/datasets/unpaired_preference.h"

#include "checks.h"
#include "data_test_util.h"
#include "fusetune/data/loader.h"
#include "fusetune/tokenizers/byte_tokenizer.h"
#include "fusetune/util/error.h"
#include "test_support.h"

namespace fusetune {
namespace {

using testing::FakeTokenizer;
using testing::L;
using testing::write_file;
using BT = ByteTokenizer;
using testing::I;

std::vector<int32_t> targets(const Sample& s) {
  std::vector<int32_t> t;
  for (int32_t l : s.labels)
    if (l != I) t.push_back(l);
  return t;
}

TEST(DataPreference, ThreeRowLayoutsGiveTheSamePair) {
  testing::TempDir dir;
  FakeTokenizer tok;
  DatasetOptions o;
  o.kind = "preference";
  o.template_name = "llama3";
  o.source = write_file(
      dir / "p.jsonl",
      R"({"chosen": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "good"}], "rejected": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "bad"}]})"
      "\n"
      R"({"conversations": [{"from": "human", "value": "Q"}], "chosen": {"from": "gpt", "value": "good"}, "rejected": {"from": "gpt", "value": "bad"}})"
      "\n"
      R"({"question": "Q", "response_j": "good", "response_k": "bad"})"
      "\n");
  // Row 3 uses other column names: it gets its own file with a column map below.
  o.split = "train[:2]";
  auto ds = build_preference_dataset(o, tok);
  ASSERT_EQ(ds->size(), 2);
  o.source = write_file(dir / "se.jsonl",
                        R"({"question": "Q", "response_j": "good", "response_k": "bad"})");
  o.split = "train";
  o.column_map = {{"prompt", "question"}, {"chosen", "response_j"}, {"rejected", "response_k"}};
  auto se = build_preference_dataset(o, tok);
  for (const PreferencePair* p : {&ds->get(0), &ds->get(1), &se->get(0)}) {
    EXPECT_EQ(p->chosen.tokens, ds->get(0).chosen.tokens);
    EXPECT_EQ(p->rejected.tokens, ds->get(0).rejected.tokens);
    EXPECT_EQ(targets(p->chosen), L({"good", FakeTokenizer::kEot}));
    EXPECT_EQ(targets(p->rejected), L({"bad", FakeTokenizer::kEot}));
  }
}

TEST(DataPreference, ReplyMustBeAssistantAndErrorsNameTheRow) {
  testing::TempDir dir;
  BT tok;
  DatasetOptions o;
  o.kind = "preference";
  o.source = write_file(
      dir / "p.json",
      R"([{"chosen": [{"role": "user", "content": "Q"}], "rejected": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "x"}]}])");
  try {
    build_preference_dataset(o, tok);
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("p.json element [0]"), std::string::npos) << m;
    EXPECT_NE(m.find("expected the assistant's reply"), std::string::npos) << m;
  }
  o.packed = true;
  EXPECT_THROW(build_preference_dataset(o, tok), Error);
}

TEST(DataPreference, LoaderStacksChosenThenRejected) {
  testing::TempDir dir;
  BT tok;
  DatasetOptions o;
  o.kind = "preference";
  o.source = write_file(dir / "p.jsonl",
                        "{\"prompt\": \"a\", \"chosen\": \"b\", \"rejected\": \"cc\"}\n"
                        "{\"prompt\": \"d\", \"chosen\": \"e\", \"rejected\": \"f\"}\n");
  auto ds = build_preference_dataset(o, tok);
  LoaderOptions lo;
  lo.batch_size = 2;
  lo.shuffle = false;
  lo.collate.pad_mode = PadMode::kLongest;
  lo.collate.pad_id = BT::kPad;
  DataLoader loader(*ds, lo);
  Batch b = loader.next();
  ASSERT_EQ(b.batch_size, 4);
  ASSERT_EQ(b.seq_len, 5);  // BOS a cc EOS
  auto row = [&](int r) {
    return std::vector<int32_t>(b.tokens.begin() + r * 5, b.tokens.begin() + r * 5 + 5);
  };
  EXPECT_EQ(row(0), L({BT::kBos, "ab", BT::kEos, BT::kPad}));
  EXPECT_EQ(row(1), L({BT::kBos, "de", BT::kEos, BT::kPad}));
  EXPECT_EQ(row(2), L({BT::kBos, "acc", BT::kEos}));
  EXPECT_EQ(row(3), L({BT::kBos, "df", BT::kEos, BT::kPad}));
  // Shifted: position of the prompt's last token predicts the reply.
  EXPECT_EQ(b.labels[1], 'b');
  EXPECT_EQ(b.labels[2 * 5 + 1], 'c');
}

// TRL's unpaired rows (KTO): the standard and the conversational layout render as the paired
// reader renders a pair's side, and each row keeps its label as the batch's desirable mask.
TEST(DataUnpairedPreference, BothLayoutsGiveThePairedSidesAndTheLoaderKeepsTheLabels) {
  testing::TempDir dir;
  FakeTokenizer tok;
  DatasetOptions o;
  o.kind = "preference";
  o.template_name = "llama3";
  o.source = write_file(dir / "p.jsonl", R"({"prompt": "Q", "chosen": "good", "rejected": "bad"})");
  auto pairs = build_preference_dataset(o, tok);
  o.kind = "unpaired_preference";
  o.source = write_file(
      dir / "u.jsonl",
      R"({"prompt": "Q", "completion": "good", "label": true})"
      "\n"
      R"({"prompt": [{"role": "user", "content": "Q"}], "completion": [{"role": "assistant", "content": "bad"}], "label": false})"
      "\n"
      R"({"prompt": [{"from": "human", "value": "Q"}], "completion": [{"from": "gpt", "value": "good"}], "label": true})"
      "\n");
  auto ds = build_preference_dataset(o, tok);
  ASSERT_TRUE(ds->unpaired());
  ASSERT_EQ(ds->size(), 3);
  EXPECT_FALSE(pairs->unpaired());
  for (int i : {0, 2}) {
    EXPECT_EQ(ds->example(i).sample.tokens, pairs->get(0).chosen.tokens) << i;
    EXPECT_EQ(ds->example(i).sample.labels, pairs->get(0).chosen.labels) << i;
    EXPECT_TRUE(ds->example(i).desirable);
  }
  EXPECT_EQ(ds->example(1).sample.tokens, pairs->get(0).rejected.tokens);
  EXPECT_EQ(ds->example(1).sample.labels, pairs->get(0).rejected.labels);
  EXPECT_FALSE(ds->example(1).desirable);
  EXPECT_THROW(ds->get(0), Error);  // no pairs here
  LoaderOptions lo;
  lo.batch_size = 3;
  lo.shuffle = false;
  lo.collate.pad_mode = PadMode::kLongest;
  lo.collate.pad_id = FakeTokenizer::kPad;
  DataLoader loader(*ds, lo);
  const Batch b = loader.next();
  EXPECT_EQ(b.batch_size, 3);  // one row per example
  EXPECT_TRUE(b.unpaired);
  EXPECT_EQ(b.desirable, (std::vector<uint8_t>{1, 0, 1}));
  // A paired batch carries its mask too: B chosen rows, then B rejected.
  DataLoader paired(*pairs, [&] {
    LoaderOptions p = lo;
    p.batch_size = 1;
    return p;
  }());
  const Batch pb = paired.next();
  EXPECT_FALSE(pb.unpaired);
  EXPECT_EQ(pb.desirable, (std::vector<uint8_t>{1, 0}));
}

// A row without a label, or with one that is not true or false, is a bad row named by file and
// line; on_bad_row: skip counts it.
TEST(DataUnpairedPreference, MissingOrNonBooleanLabelsAreBadRowsNamedByFileAndLine) {
  testing::TempDir dir;
  BT tok;
  DatasetOptions o;
  o.kind = "unpaired_preference";
  const std::string good = R"({"prompt": "a", "completion": "b", "label": false})";
  for (const auto& [bad, says] :
       {std::pair<std::string, std::string>{R"({"prompt": "a", "completion": "b"})",
                                            "missing column 'label'"},
        {R"({"prompt": "a", "completion": "b", "label": "yes"})",
         "column 'label' is a string, expected true (a desirable completion) or false"},
        {R"({"prompt": "a", "completion": "b", "label": 1})", "column 'label' is an integer"},
        {R"({"prompt": "a", "completion": 7, "label": true})", "column 'completion' is an integer"},
        {R"({"prompt": "a", "completion": [{"role": "user", "content": "b"}], "label": true})",
         "expected the assistant's reply"}}) {
    SCOPED_TRACE(bad);
    o.source = write_file(dir / "u.jsonl", good + "\n" + bad + "\n");
    o.on_bad_row = "error";
    const std::string e = testing::error_of([&] { build_preference_dataset(o, tok); });
    EXPECT_NE(e.find("u.jsonl line 2"), std::string::npos) << e;
    EXPECT_NE(e.find(says), std::string::npos) << e;
    o.on_bad_row = "skip";
    auto ds = build_preference_dataset(o, tok);
    EXPECT_EQ(ds->size(), 1);
    EXPECT_EQ(ds->report().bad_rows_skipped, 1);
  }
  // column_map renames TRL's columns; packing is refused.
  o.on_bad_row = "error";
  o.source = write_file(dir / "m.jsonl", R"({"q": "a", "a": "b", "ok": true})");
  o.column_map = {{"prompt", "q"}, {"completion", "a"}, {"label", "ok"}};
  EXPECT_TRUE(build_preference_dataset(o, tok)->example(0).desirable);
  o.packed = true;
  EXPECT_THROW(build_preference_dataset(o, tok), Error);
}

}  // namespace
}  // namespace fusetune
