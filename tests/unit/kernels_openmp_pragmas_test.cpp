// A source check, not a numerical one: in OpenMP 5, an `if` clause without a directive name
// on a combined `parallel for simd` applies to the simd part too, so a loop below the
// parallel threshold also runs unvectorized (SwiGLU on 16K elements was 10x slower than on a
// whole tensor: every kernel call on a chunk, a small model or one decode token paid it). The
// clause must say `if (parallel: ...)`.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "test_paths.h"

namespace fs = std::filesystem;

TEST(OpenMpPragmas, SimdLoopsLimitTheirIfClauseToTheParallelPart) {
  const fs::path src = fs::path(::fusetune::testing::source_dir()) / "src";
  ASSERT_TRUE(fs::is_directory(src)) << src;
  const std::regex simd_with_if(R"(#\s*pragma\s+omp\b.*\bsimd\b.*\bif\s*\()");
  const std::regex named_if(R"(\bif\s*\(\s*parallel\s*:)");
  int pragmas = 0;
  for (const auto& entry : fs::recursive_directory_iterator(src)) {
    const std::string ext = entry.path().extension().string();
    if (ext != ".cpp" && ext != ".h") continue;
    std::ifstream in(entry.path());
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
      if (!std::regex_search(line, simd_with_if)) continue;
      ++pragmas;
      EXPECT_TRUE(std::regex_search(line, named_if))
          << entry.path().string() << ":" << number << ": " << line;
    }
  }
  EXPECT_GT(pragmas, 0) << "no `omp ... simd ... if` pragma found: is the pattern still right?";
}
