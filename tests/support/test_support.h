#pragma once
// Helpers shared by tests: where the real assets live, and a scratch directory per test.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "test_paths.h"

namespace fusetune::testing {

// ../shared/assets beside the checkout, or $FUSETUNE_ASSETS. Empty when absent.
std::filesystem::path assets_dir();

// FUSETUNE_REQUIRE_ASSETS=1 (set by .ci/run, which has ../shared and Node): a test that
// would skip for a missing asset or reference implementation fails instead, so CI never
// passes by skipping. Without it a newcomer gets skips with a clear message.
bool assets_required();

// Skips the current test with `why`, or fails it under FUSETUNE_REQUIRE_ASSETS=1.
#define FT_SKIP_UNLESS_REQUIRED(why)                                               \
  do {                                                                             \
    if (::fusetune::testing::assets_required())                                    \
      FAIL() << why << " (FUSETUNE_REQUIRE_ASSETS=1: required here, not skipped)"; \
    GTEST_SKIP() << why;                                                           \
  } while (0)

// Skips (or, under FUSETUNE_REQUIRE_ASSETS=1, fails) the current test when an asset is missing.
#define FT_REQUIRE_ASSET(rel)                                                                      \
  do {                                                                                             \
    if (::fusetune::testing::assets_dir().empty() ||                                               \
        !std::filesystem::exists(::fusetune::testing::assets_dir() / (rel)))                       \
      FT_SKIP_UNLESS_REQUIRED(std::string("asset ") + (rel) +                                      \
                              " not found (expected under ../shared/assets or $FUSETUNE_ASSETS)"); \
  } while (0)

// A fresh empty directory under the build tree's temp area, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& rel) const { return path_ / rel; }

 private:
  std::filesystem::path path_;
};

}  // namespace fusetune::testing
