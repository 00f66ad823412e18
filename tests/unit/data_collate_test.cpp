#include "data_test_util.h"
#include "fusetune/data/collate.h"

#include <gtest/gtest.h>

#include "fusetune/util/error.h"

namespace fusetune {
namespace {

using testing::I;

Sample make_collate_sample(int n, int first_target = 0) {
  Sample s;
  for (int i = 0; i < n; ++i) {
    s.tokens.push_back(100 + i);
    s.labels.push_back(i >= first_target ? 100 + i : I);
  }
  return s;
}

TEST(DataCollate, PaddedLengthBuckets) {
  CollateOptions o;
  EXPECT_EQ(padded_length(1, o), 64);
  EXPECT_EQ(padded_length(64, o), 64);
  EXPECT_EQ(padded_length(65, o), 128);
  o.max_seq_len = 100;
  EXPECT_EQ(padded_length(65, o), 100);  // capped
  o.pad_mode = PadMode::kPowerOfTwo;
  o.max_seq_len = 0;
  EXPECT_EQ(padded_length(5, o), 8);
  EXPECT_EQ(padded_length(8, o), 8);
  EXPECT_EQ(padded_length(129, o), 256);
  o.pad_mode = PadMode::kLongest;
  EXPECT_EQ(padded_length(37, o), 37);
  o.pad_mode = PadMode::kFixed;
  EXPECT_THROW(padded_length(5, o), Error);
  o.max_seq_len = 48;
  EXPECT_EQ(padded_length(5, o), 48);
  EXPECT_EQ(parse_pad_mode("pow2"), PadMode::kPowerOfTwo);
  EXPECT_THROW(parse_pad_mode("pow3"), Error);
}

TEST(DataCollate, ShiftsPadsAndNumbersPositions) {
  Sample a = make_collate_sample(5, 2), b = make_collate_sample(3);
  CollateOptions o;
  o.pad_mode = PadMode::kMultiple;
  o.pad_multiple = 4;
  o.pad_id = 7;
  Batch batch = collate({&a, &b}, o);
  ASSERT_EQ(batch.batch_size, 2);
  ASSERT_EQ(batch.seq_len, 8);
  std::vector<int32_t> tokens = {100, 101, 102, 103, 104, 7, 7, 7, 100, 101, 102, 7, 7, 7, 7, 7};
  std::vector<int32_t> labels = {I, 102, 103, 104, I, I, I, I, 101, 102, I, I, I, I, I, I};
  EXPECT_EQ(batch.tokens, tokens);
  EXPECT_EQ(batch.labels, labels);
  for (int r = 0; r < 2; ++r)
    for (int i = 0; i < 8; ++i) EXPECT_EQ(batch.positions[r * 8 + i], i);
  EXPECT_TRUE(batch.doc_ids.empty());
  EXPECT_EQ(batch.num_valid_labels(), 5);
  // The shift, checked as the rule itself: every target is the next token of its row.
  for (int r = 0; r < 2; ++r)
    for (int i = 0; i + 1 < 8; ++i) {
      if (batch.labels[r * 8 + i] != I) {
        EXPECT_EQ(batch.labels[r * 8 + i], batch.tokens[r * 8 + i + 1]);
      }
    }
}

TEST(DataCollate, FixedModeAlwaysMaxSeqLen) {
  Sample a = make_collate_sample(3);
  CollateOptions o;
  o.pad_mode = PadMode::kFixed;
  o.max_seq_len = 16;
  EXPECT_EQ(collate({&a}, o).seq_len, 16);
}

TEST(DataCollate, RejectsSampleLongerThanCap) {
  Sample a = make_collate_sample(20);
  CollateOptions o;
  o.max_seq_len = 16;
  EXPECT_THROW(collate({&a}, o), Error);
}

TEST(DataCollate, PackedRowsKeepLengthAndDocIds) {
  Sample row{{1, 2, 3, 4, 5, 0}, {1, 2, 3, 4, 5, I}, {0, 0, 0, 1, 1, 2}};
  CollateOptions o;  // multiple-of-64 must not pad packed rows
  Batch b = collate({&row, &row}, o);
  EXPECT_EQ(b.seq_len, 6);
  EXPECT_EQ(b.doc_ids, (std::vector<int32_t>{0, 0, 0, 1, 1, 2, 0, 0, 0, 1, 1, 2}));
  EXPECT_EQ(std::vector<int32_t>(b.labels.begin(), b.labels.begin() + 6),
            (std::vector<int32_t>{2, 3, I, 5, I, I}));
  EXPECT_EQ(std::vector<int32_t>(b.positions.begin(), b.positions.begin() + 6),
            (std::vector<int32_t>{0, 1, 2, 0, 1, 0}));
  Sample plain = make_collate_sample(3);
  EXPECT_THROW(collate({&row, &plain}, o), Error);
}

}  // namespace
}  // namespace fusetune
