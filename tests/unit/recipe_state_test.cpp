// The one recipe_state serializer (recipes/recipe_state.h): every recipe's checkpoint is
// published whole, in one rename, and its state reads back as written.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "fusetune/recipes/recipe_state.h"
#include "fusetune/recipes/registry.h"
#include "fusetune/util/error.h"
#include "fusetune/util/fs.h"
#include "test_support.h"

using namespace fusetune;
namespace fs = std::filesystem;

namespace {

void write_text_file(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

RecipeState state_at(int64_t step) {
  RecipeState s;
  s.progress.epoch = 1;
  s.progress.step_in_epoch = 2;
  s.progress.global_step = step;
  s.progress.loader = {1, 6};
  s.progress.seed = 42;
  return s;
}

}  // namespace

TEST(RecipeState, ProgressReadsBackAsWritten) {
  fusetune::testing::TempDir tmp;
  const fs::path dir = tmp / "epoch_0";
  RecipeState s = state_at(7);
  s.adapter = true;
  publish_checkpoint(
      dir, [](const fs::path& staging) { write_text_file(staging / "a", "x"); }, s);
  const std::optional<TrainingProgress> p = read_recipe_progress(dir);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->global_step, 7);
  EXPECT_EQ(p->step_in_epoch, 2);
  EXPECT_EQ(p->loader.index, 6);
  EXPECT_EQ(p->seed, 42u);
  EXPECT_TRUE(fs::exists(dir / "a"));
  EXPECT_TRUE(fs::exists(dir / "recipe_state.safetensors"));
  EXPECT_NE(read_file(dir / "recipe_state.json").find("\"adapter\": true"), std::string::npos);
  EXPECT_FALSE(read_recipe_progress(tmp / "missing").has_value());
}

// A save that fails while writing the model files leaves the previous checkpoint as it was:
// never new weights beside an old state, or the other way round.
TEST(RecipeState, AFailedSaveLeavesThePreviousCheckpointWhole) {
  fusetune::testing::TempDir tmp;
  const fs::path dir = tmp / "epoch_0";
  publish_checkpoint(
      dir, [](const fs::path& staging) { write_text_file(staging / "config.json", "old"); },
      state_at(3));
  EXPECT_THROW(publish_checkpoint(
                   dir,
                   [](const fs::path& staging) {
                     write_text_file(staging / "config.json", "new");
                     throw Error("disk full");
                   },
                   state_at(9)),
               Error);
  EXPECT_EQ(read_file(dir / "config.json"), "old");
  EXPECT_EQ(read_recipe_progress(dir)->global_step, 3);
  // Replacing works once the save completes.
  publish_checkpoint(
      dir, [](const fs::path& staging) { write_text_file(staging / "config.json", "new"); },
      state_at(9));
  EXPECT_EQ(read_file(dir / "config.json"), "new");
  EXPECT_EQ(read_recipe_progress(dir)->global_step, 9);
}

TEST(RecipeState, RefusesToReplaceADirectoryThatIsNotACheckpoint) {
  fusetune::testing::TempDir tmp;
  const fs::path dir = tmp / "mine";
  fs::create_directories(dir);
  write_text_file(dir / "notes.txt", "keep me");
  EXPECT_THROW(publish_checkpoint(
                   dir, [](const fs::path&) {}, state_at(1)),
               Error);
  EXPECT_EQ(read_file(dir / "notes.txt"), "keep me");
}

// The traits on the registry entries say what the recipe names used to (planning reads them).
TEST(RecipeTraits, MatchEveryRecipesName) {
  for (const RecipeInfo& r : recipes()) {
    SCOPED_TRACE(r.name);
    const bool named_lora = r.name.find("lora") != std::string::npos;
    EXPECT_EQ(r.traits.lora, named_lora);
    EXPECT_EQ(r.traits.qat, r.name.rfind("qat", 0) == 0);
    EXPECT_EQ(r.traits.dpo, r.name.find("dpo") != std::string::npos);
    EXPECT_EQ(r.traits.distributed, r.name.find("_distributed") != std::string::npos);
    EXPECT_EQ(r.traits.trains, r.name != "generate" && r.name != "eval");
    EXPECT_EQ(&recipe_traits(r.name), &r.traits);
  }
}
