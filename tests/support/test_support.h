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
inline std::filesystem::path assets_dir() {
  if (const char* env = std::getenv("FUSETUNE_ASSETS")) return env;
  std::filesystem::path p = std::filesystem::path(::fusetune::testing::source_dir()) / ".." / "shared" / "assets";
  return std::filesystem::exists(p) ? std::filesystem::canonical(p) : std::filesystem::path();
}

// FUSETUNE_REQUIRE_ASSETS=1 (set by .ci/run, which has ../shared and Node): a test that
// would skip for a missing asset or reference implementation fails instead, so CI never
// passes by skipping. Without it a newcomer gets skips with a clear message.
inline bool assets_required() {
  const char* v = std::getenv("FUSETUNE_REQUIRE_ASSETS");
  return v != nullptr && std::string(v) == "1";
}

// Skips the current test with `why`, or fails it under FUSETUNE_REQUIRE_ASSETS=1.
#define FT_SKIP_UNLESS_REQUIRED(why)                                                 \
  do {                                                                              \
    if (::fusetune::testing::assets_required())                                     \
      FAIL() << why << " (FUSETUNE_REQUIRE_ASSETS=1: required here, not skipped)";  \
    GTEST_SKIP() << why;                                                            \
  } while (0)

// Skips (or, under FUSETUNE_REQUIRE_ASSETS=1, fails) the current test when an asset is missing.
#define FT_REQUIRE_ASSET(rel)                                                                 \
  do {                                                                                        \
    if (::fusetune::testing::assets_dir().empty() ||                                          \
        !std::filesystem::exists(::fusetune::testing::assets_dir() / (rel)))                  \
      FT_SKIP_UNLESS_REQUIRED(std::string("asset ") + (rel) +                                 \
                              " not found (expected under ../shared/assets or $FUSETUNE_ASSETS)"); \
  } while (0)

// A fresh empty directory under the build tree's temp area, removed when the object dies.
class TempDir {
 public:
  TempDir() {
    auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info ? info->test_suite_name() : "t") + "_" +
                       (info ? info->name() : "x") + "_" + std::to_string(::getpid());
    for (char& c : name)
      if (c == '/') c = '_';
    path_ = std::filesystem::temp_directory_path() / "fusetune_tests" / name;
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& rel) const { return path_ / rel; }

 private:
  std::filesystem::path path_;
};

}  // namespace fusetune::testing
