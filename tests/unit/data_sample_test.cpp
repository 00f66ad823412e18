#include "data_test_util.h"
#include "fusetune/data/sample.h"

#include <gtest/gtest.h>

#include "fusetune/util/error.h"

namespace fusetune {
namespace {

using testing::I;

TEST(DataSample, ShiftMovesTargetsOneLeftAndIgnoresTheLast) {
  std::vector<int32_t> labels = {10, 11, 12, 13};
  EXPECT_EQ(shift_labels(labels, {}), (std::vector<int32_t>{11, 12, 13, I}));
}

TEST(DataSample, ShiftKeepsPromptMaskAligned) {
  // Prompt tokens 0..1 masked: position 1 predicts token 2, the first response token.
  std::vector<int32_t> labels = {I, I, 12, 13};
  EXPECT_EQ(shift_labels(labels, {}), (std::vector<int32_t>{I, 12, 13, I}));
}

TEST(DataSample, ShiftNeverCrossesDocuments) {
  std::vector<int32_t> labels = {1, 2, 3, 4, 5, I};
  std::vector<int32_t> docs = {0, 0, 0, 1, 1, 2};
  EXPECT_EQ(shift_labels(labels, docs), (std::vector<int32_t>{2, 3, I, 5, I, I}));
}

TEST(DataSample, ShiftRejectsMismatchedDocIds) {
  EXPECT_THROW(shift_labels({1, 2, 3}, {0, 0}), Error);
}

TEST(DataSample, PositionsRestartPerDocument) {
  EXPECT_EQ(positions_for(4, {}), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(positions_for(6, {0, 0, 0, 1, 1, 2}), (std::vector<int32_t>{0, 1, 2, 0, 1, 0}));
}

TEST(DataSample, CountTargetsAndTruncate) {
  Sample s{{1, 2, 3, 4}, {I, I, 3, 4}, {}};
  EXPECT_EQ(count_targets(s), 2);
  Sample only_first{{1, 2}, {1, I}, {}};
  EXPECT_EQ(count_targets(only_first), 0);  // the first token is never a target
  EXPECT_FALSE(truncate_sample(s, 0));
  EXPECT_FALSE(truncate_sample(s, 4));
  EXPECT_TRUE(truncate_sample(s, 3));
  EXPECT_EQ(s.tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(s.labels, (std::vector<int32_t>{I, I, 3}));
}

}  // namespace
}  // namespace fusetune
