// Golden runs: every case of the recipe matrix (tests/support/recipe_matrix.h) under each
// compile mode (false, model, true) trains 3 steps; its digest is the run's exit code, the
// values each step logged (loss, lr, grad_norm, DPO rewards, at full precision) and the size and
// FNV-1a hash of every file its final checkpoint holds. Recorded once before a refactor and
// compared after it, the digests show that the change kept every recipe's numbers bit for bit
// (docs/testing.md). Not a CTest test: the digests hold on the machine that recorded them (the
// kernels differ between AVX2 and AVX-512), so they are never committed.
//   FUSETUNE_GOLDEN=record:DIR  build/release/tests/fusetune_golden_runs
//   FUSETUNE_GOLDEN=compare:DIR build/release/tests/fusetune_golden_runs [--gtest_filter=...]
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "recipe_matrix.h"

using namespace fusetune::testing;
namespace fs = std::filesystem;

namespace {

struct GoldenRun {
  RecipeCase recipe;
  const char* compile;  // the `compile` key
};

std::vector<GoldenRun> golden_runs() {
  std::vector<GoldenRun> runs;
  for (const RecipeCase& c : recipe_matrix())
    for (const char* mode : {"false", "model", "true"}) runs.push_back({c, mode});
  return runs;
}

std::string run_name(const GoldenRun& r) {
  return std::string(r.recipe.name) + "_compile_" + r.compile;
}

// gtest prints a failing run by its name.
void PrintTo(const GoldenRun& r, std::ostream* os) { *os << run_name(r); }

uint64_t fnv1a(const std::string& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Every file under `dir` (recursively) but the logs, by path relative to `dir`, with its size and
// hash: weights, adapters, optimizer state, recipe_state.json, the configs a checkpoint carries.
std::string checkpoint_digest(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const std::string rel = fs::relative(e.path(), dir).string();
    if (rel.rfind("logs/", 0) == 0 || e.path().extension() == ".log") continue;
    const std::string bytes = read_text(e.path());
    std::ostringstream line;
    line << bytes.size() << " " << std::hex << fnv1a(bytes);
    files[rel] = line.str();
  }
  std::ostringstream s;
  for (const auto& [rel, line] : files) s << "file " << rel << ": " << line << "\n";
  return s.str();
}

std::string digest(const GoldenRun& r, const fs::path& tmp) {
  Overrides o = {{"epochs", "1"}, {"max_steps_per_epoch", "3"}, {"compile", r.compile}};
  const fs::path config = write_case_config(r.recipe, tmp, o);
  if (config.empty()) return "no config\n";
  const fs::path out = tmp / "out";
  o["output_dir"] = out.string();
  const CliRun run = run_recipe(r.recipe.ranks, r.recipe.recipe, config, o, tmp / "io");
  std::ostringstream s;
  s << "exit " << run.code << "\n";
  if (run.code != 0) {
    // A refusal is behaviour too: keep its message's first line.
    s << "stderr " << run.err.substr(0, run.err.find('\n')) << "\n";
    return s.str();
  }
  for (const auto& [step, values] : compared_step_values(out))
    s << "step " << step << ": " << values.dump() << "\n";
  s << checkpoint_digest(out);
  return s.str();
}

class Golden : public ::testing::TestWithParam<GoldenRun> {};

TEST_P(Golden, RunMatchesItsRecordedDigest) {
  const GoldenRun& r = GetParam();
  const char* spec = std::getenv("FUSETUNE_GOLDEN");
  ASSERT_NE(spec, nullptr) << "set FUSETUNE_GOLDEN=record:DIR or compare:DIR";
  const std::string s = spec;
  const size_t colon = s.find(':');
  ASSERT_NE(colon, std::string::npos) << "FUSETUNE_GOLDEN=" << s << ": expected MODE:DIR";
  const std::string mode = s.substr(0, colon);
  const fs::path file = fs::path(s.substr(colon + 1)) / (run_name(r) + ".txt");
  ASSERT_TRUE(mode == "record" || mode == "compare") << "FUSETUNE_GOLDEN mode " << mode;
  if (r.recipe.ranks > 1) FT_REQUIRE_MPIRUN();
  const TempDir tmp;
  const std::string got = digest(r, tmp.path());
  if (mode == "record") {
    fs::create_directories(file.parent_path());
    write_text(file, got);
    return;
  }
  ASSERT_TRUE(fs::exists(file)) << "no recorded digest " << file;
  EXPECT_EQ(got, read_text(file)) << run_name(r);
}

INSTANTIATE_TEST_SUITE_P(Matrix, Golden, ::testing::ValuesIn(golden_runs()),
                         [](const ::testing::TestParamInfo<GoldenRun>& i) {
                           return run_name(i.param);
                         });

}  // namespace
