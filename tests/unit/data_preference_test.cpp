#include "fusetune/data/datasets/preference.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace fusetune
