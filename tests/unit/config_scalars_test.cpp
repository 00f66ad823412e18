// Scalar parsing shared by Config and the schema.
#include <gtest/gtest.h>

#include <cmath>

#include "fusetune/config/scalars.h"

using namespace fusetune;

TEST(ConfigScalars, Ints) {
  EXPECT_EQ(parse_int("42"), 42);
  EXPECT_EQ(parse_int("-3"), -3);
  EXPECT_EQ(parse_int("+3"), 3);
  EXPECT_EQ(parse_int(" 8 "), 8);
  EXPECT_EQ(parse_int("1e3"), std::nullopt);
  EXPECT_EQ(parse_int("2.0"), std::nullopt);
  EXPECT_EQ(parse_int("abc"), std::nullopt);
  EXPECT_EQ(parse_int(""), std::nullopt);
  EXPECT_EQ(parse_int("++1"), std::nullopt);
  EXPECT_EQ(parse_int("99999999999999999999"), std::nullopt);  // out of range
}

TEST(ConfigScalars, Floats) {
  EXPECT_EQ(parse_float("2e-5"), 2e-5);
  EXPECT_EQ(parse_float("1.0e-4"), 1e-4);
  EXPECT_EQ(parse_float("3"), 3.0);
  EXPECT_EQ(parse_float("-0.5"), -0.5);
  EXPECT_EQ(parse_float(".5"), 0.5);
  EXPECT_TRUE(std::isinf(*parse_float(".inf")));
  EXPECT_TRUE(std::isnan(*parse_float(".nan")));
  EXPECT_EQ(parse_float("nan"), std::nullopt);
  EXPECT_EQ(parse_float("inf"), std::nullopt);
  EXPECT_EQ(parse_float("1e-4x"), std::nullopt);
  EXPECT_EQ(parse_float("abc"), std::nullopt);
  EXPECT_EQ(parse_float(""), std::nullopt);
}

TEST(ConfigScalars, Bools) {
  EXPECT_EQ(parse_bool("true"), true);
  EXPECT_EQ(parse_bool("True"), true);
  EXPECT_EQ(parse_bool("FALSE"), false);
  EXPECT_EQ(parse_bool("yes"), std::nullopt);  // YAML 1.2: not a boolean
  EXPECT_EQ(parse_bool("1"), std::nullopt);
}

TEST(ConfigScalars, ByteSizes) {
  EXPECT_EQ(parse_byte_size("1000"), 1000);
  EXPECT_EQ(parse_byte_size("5GB"), 5000000000LL);
  EXPECT_EQ(parse_byte_size("5gb"), 5000000000LL);
  EXPECT_EQ(parse_byte_size("2GiB"), 2LL << 30);
  EXPECT_EQ(parse_byte_size("1.5MB"), 1500000);
  EXPECT_EQ(parse_byte_size("300 KB"), 300000);
  EXPECT_EQ(parse_byte_size("512MiB"), 512LL << 20);
  EXPECT_EQ(parse_byte_size("5XB"), std::nullopt);
  EXPECT_EQ(parse_byte_size("GB"), std::nullopt);
  EXPECT_EQ(parse_byte_size("0"), std::nullopt);
  EXPECT_EQ(parse_byte_size("-5GB"), std::nullopt);
  EXPECT_EQ(parse_byte_size("1e30TB"), std::nullopt);
}
