#include "data_test_util.h"
#include "fusetune/data/packing.h"

#include <gtest/gtest.h>

#include "fusetune/data/collate.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

using testing::I;
constexpr int32_t kPad = 0;

// Documents whose tokens encode (doc, index) so that any label crossing a boundary shows.
Sample doc(int d, int n) {
  Sample s;
  for (int i = 0; i < n; ++i) {
    s.tokens.push_back(d * 100 + i + 1);
    s.labels.push_back(d * 100 + i + 1);
  }
  return s;
}

SampleDataset dataset(std::vector<int> lengths) {
  std::vector<Sample> v;
  for (size_t d = 0; d < lengths.size(); ++d) v.push_back(doc(static_cast<int>(d) + 1, lengths[d]));
  DatasetReport r;
  r.name = "test";
  return SampleDataset(std::move(v), r);
}

TEST(DataPacking, RowsAreExactlyMaxSeqLenWithDocIds) {
  auto ds = dataset({3, 4, 2});
  PackedDataset p(ds, 8, kPad, /*split_across_rows=*/false);
  ASSERT_EQ(p.size(), 2);  // [3 + 4 + pad 1], [2 + pad 6]
  EXPECT_TRUE(p.packed());
  EXPECT_EQ(p.report().packed_rows, 2);
  EXPECT_EQ(p.get(0).tokens, (std::vector<int32_t>{101, 102, 103, 201, 202, 203, 204, kPad}));
  EXPECT_EQ(p.get(0).doc_ids, (std::vector<int32_t>{0, 0, 0, 1, 1, 1, 1, 2}));
  EXPECT_EQ(p.get(1).doc_ids, (std::vector<int32_t>{0, 0, 1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(p.get(1).labels[2], I);
}

TEST(DataPacking, CollatedLabelsNeverCrossDocumentsAndPositionsRestart) {
  auto ds = dataset({3, 4, 2, 5, 1, 6});
  PackedDataset p(ds, 8, kPad, /*split_across_rows=*/false);
  std::vector<const Sample*> rows;
  for (int64_t i = 0; i < p.size(); ++i) rows.push_back(&p.get(i));
  Batch b = collate(rows, CollateOptions{});
  const int64_t T = b.seq_len;
  ASSERT_EQ(T, 8);
  int64_t targets = 0;
  for (int64_t r = 0; r < b.batch_size; ++r) {
    for (int64_t i = 0; i < T; ++i) {
      int64_t k = r * T + i;
      bool last_of_doc = i + 1 == T || b.doc_ids[k + 1] != b.doc_ids[k];
      if (last_of_doc) {
        EXPECT_EQ(b.labels[k], I) << "row " << r << " pos " << i;
      } else if (b.tokens[k] != kPad) {
        EXPECT_EQ(b.labels[k], b.tokens[k + 1]);
        ++targets;
      }
      bool first_of_doc = i == 0 || b.doc_ids[k - 1] != b.doc_ids[k];
      if (first_of_doc) {
        EXPECT_EQ(b.positions[k], 0);
      } else {
        EXPECT_EQ(b.positions[k], b.positions[k - 1] + 1);
      }
    }
  }
  EXPECT_EQ(targets, (3 - 1) + (4 - 1) + (2 - 1) + (5 - 1) + 0 + (6 - 1));
}

TEST(DataPacking, SplitAcrossRowsKeepsEveryToken) {
  auto ds = dataset({5, 7});
  PackedDataset p(ds, 4, kPad, /*split_across_rows=*/true);
  ASSERT_EQ(p.size(), 3);
  EXPECT_EQ(p.get(0).tokens, (std::vector<int32_t>{101, 102, 103, 104}));
  EXPECT_EQ(p.get(1).tokens, (std::vector<int32_t>{105, 201, 202, 203}));
  EXPECT_EQ(p.get(1).doc_ids, (std::vector<int32_t>{0, 1, 1, 1}));
  EXPECT_EQ(p.get(2).tokens, (std::vector<int32_t>{204, 205, 206, 207}));
  EXPECT_EQ(p.report().truncated, 0);
}

TEST(DataPacking, NoSplitTruncatesLongSamples) {
  auto ds = dataset({10, 2});
  PackedDataset p(ds, 4, kPad, /*split_across_rows=*/false);
  ASSERT_EQ(p.size(), 2);
  EXPECT_EQ(p.get(0).tokens, (std::vector<int32_t>{101, 102, 103, 104}));
  EXPECT_EQ(p.report().truncated, 1);
}

TEST(DataPacking, NeedsPositiveMaxSeqLen) {
  auto ds = dataset({3});
  EXPECT_THROW(PackedDataset(ds, 0, kPad, true), Error);
}

}  // namespace
}  // namespace fusetune
