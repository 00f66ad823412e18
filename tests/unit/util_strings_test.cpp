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

TEST(Strings, ForEachLineNumbersLinesFromOneAndKeepsTheLastWithoutNewline) {
  std::vector<std::pair<std::string, size_t>> seen;
  for_each_line("a\n\nb\r\nc",
                [&](std::string_view line, size_t n) { seen.emplace_back(std::string(line), n); });
  const std::vector<std::pair<std::string, size_t>> want = {
      {"a", 1}, {"", 2}, {"b\r", 3}, {"c", 4}};
  EXPECT_EQ(seen, want);
  seen.clear();
  for_each_line("x\n",
                [&](std::string_view line, size_t n) { seen.emplace_back(std::string(line), n); });
  EXPECT_EQ(seen, (std::vector<std::pair<std::string, size_t>>{{"x", 1}}));
  for_each_line("", [&](std::string_view, size_t) { ADD_FAILURE() << "no line in empty text"; });
}
