#include "fusetune/data/split.h"

#include <gtest/gtest.h>

#include "fusetune/util/error.h"

namespace fusetune {
namespace {

std::pair<int64_t, int64_t> R(const std::string& s, int64_t n) {
  return SplitSpec::parse(s).resolve(n);
}

TEST(DataSplit, WholeAndPercentSlices) {
  EXPECT_EQ(R("train", 10), (std::pair<int64_t, int64_t>{0, 10}));
  EXPECT_EQ(R("train[:90%]", 10), (std::pair<int64_t, int64_t>{0, 9}));
  EXPECT_EQ(R("train[90%:]", 10), (std::pair<int64_t, int64_t>{9, 10}));
  EXPECT_EQ(R("train[10%:20%]", 100), (std::pair<int64_t, int64_t>{10, 20}));
  EXPECT_EQ(R(" train[ : 50% ] ", 4), (std::pair<int64_t, int64_t>{0, 2}));
}

TEST(DataSplit, PercentRoundsHalfToEvenLikePython) {
  // 25% of 10 = 2.5 -> 2 (Python round), 35% of 10 = 3.5 -> 4.
  EXPECT_EQ(R("train[:25%]", 10).second, 2);
  EXPECT_EQ(R("train[:35%]", 10).second, 4);
  // Complementary slices partition the rows.
  for (int n : {1, 7, 99, 100, 101}) {
    auto a = R("train[:90%]", n), b = R("train[90%:]", n);
    EXPECT_EQ(a.second, b.first);
    EXPECT_EQ(b.second, n);
  }
}

TEST(DataSplit, AbsoluteAndNegativeBounds) {
  EXPECT_EQ(R("train[2:5]", 10), (std::pair<int64_t, int64_t>{2, 5}));
  EXPECT_EQ(R("train[-3:]", 10), (std::pair<int64_t, int64_t>{7, 10}));
  EXPECT_EQ(R("train[:-3]", 10), (std::pair<int64_t, int64_t>{0, 7}));
  EXPECT_EQ(R("train[5:100]", 10), (std::pair<int64_t, int64_t>{5, 10}));  // clamped
  EXPECT_EQ(R("train[8:2]", 10), (std::pair<int64_t, int64_t>{8, 8}));     // empty
  EXPECT_EQ(R("train[-20%:]", 10), (std::pair<int64_t, int64_t>{8, 10}));
}

TEST(DataSplit, RejectsMalformed) {
  for (const char* bad : {"test", "validation[:10%]", "train[:90]%", "train[1%:5]", "train[:101%]",
                          "train[a:b]", "train[:", "train[%:]"}) {
    EXPECT_THROW(SplitSpec::parse(bad), Error) << bad;
  }
  try {
    SplitSpec::parse("test");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("only the 'train' split"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fusetune
