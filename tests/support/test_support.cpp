#include "test_support.h"

#include <unistd.h>

#include <cstdlib>

namespace fusetune::testing {

std::filesystem::path assets_dir() {
  if (const char* env = std::getenv("FUSETUNE_ASSETS")) return env;
  std::filesystem::path p = std::filesystem::path(source_dir()) / ".." / "shared" / "assets";
  return std::filesystem::exists(p) ? std::filesystem::canonical(p) : std::filesystem::path();
}

bool assets_required() {
  const char* v = std::getenv("FUSETUNE_REQUIRE_ASSETS");
  return v != nullptr && std::string(v) == "1";
}

TempDir::TempDir() {
  auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string(info ? info->test_suite_name() : "t") + "_" +
                     (info ? info->name() : "x") + "_" + std::to_string(::getpid());
  for (char& c : name)
    if (c == '/') c = '_';
  path_ = std::filesystem::temp_directory_path() / "fusetune_tests" / name;
  std::filesystem::remove_all(path_);
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() { std::filesystem::remove_all(path_); }

}  // namespace fusetune::testing
