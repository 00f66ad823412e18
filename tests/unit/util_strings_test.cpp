#include <gtest/gtest.h>

#include "fusetune/util/strings.h"

using namespace fusetune;

TEST(Strings, EditDistance) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("optimizer", "optimzer"), 1u);
}

TEST(Strings, ClosestMatchSuggestsNearKeysOnly) {
  std::vector<std::string> keys = {"batch_size", "epochs", "optimizer", "output_dir"};
  EXPECT_EQ(closest_match("batch_sise", keys), "batch_size");
  EXPECT_EQ(closest_match("optimzer", keys), "optimizer");
  EXPECT_EQ(closest_match("completely_unrelated", keys), "");
}
