// The trainer's typed pieces (issue 27): its settings (recipes/train_settings.h: every default
// comes from the recipe's schema, so a config read with or without the schema's defaults
// applied gives the same settings, and `seed` has one default), the recipe traits on the
// registry entries, the one recipe_state serializer (recipes/recipe_state.h: every recipe's
// checkpoint is published whole, in one rename) and the optimizer builders (build_optimizer is
// torchtune's instantiate over the component table). One file: a GCC 12 -Warray-bounds false
// positive appears in an existing test when more files reshuffle the unity batches.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "fusetune/config/builtin_configs.h"
#include "fusetune/config/components.h"
#include "fusetune/config/recipe_schemas.h"
#include "fusetune/config/schema.h"
#include "fusetune/optim/optimizer.h"
#include "fusetune/recipes/recipe_setup.h"
#include "fusetune/recipes/recipe_state.h"
#include "fusetune/recipes/registry.h"
#include "fusetune/recipes/train_settings.h"
#include "fusetune/util/error.h"
#include "fusetune/util/fs.h"
#include "test_support.h"

using namespace fusetune;
namespace fs = std::filesystem;

namespace {

bool is_training_recipe(const RecipeInfo& r) {
  for (const Field& f : r.schema->fields)
    if (f.name == "epochs") return true;
  return false;
}

}  // namespace

TEST(TrainSettings, TheSameWithAndWithoutSchemaDefaultsForEveryTrainingConfig) {
  int checked = 0;
  for (const BuiltinConfig& b : builtin_configs()) {
    if (b.recipe.empty()) continue;
    const RecipeInfo& r = find_recipe(b.recipe);
    if (!is_training_recipe(r)) continue;
    SCOPED_TRACE(b.name);
    Config raw = load_config(b.name);
    raw.resolve();
    validate(raw, *r.schema);
    const TrainSettings from_raw = parse_train_settings(raw, *r.schema);
    const TrainSettings from_defaulted =
        parse_train_settings(with_defaults(raw, *r.schema), *r.schema);
    EXPECT_TRUE(from_raw == from_defaulted);
    ++checked;
  }
  EXPECT_GT(checked, 10);
}

TEST(TrainSettings, SeedHasOneDefaultTheSchemas) {
  const Schema& schema = full_finetune_schema();
  const uint64_t schema_seed = uint64_t(std::stoll(schema.field("seed").default_yaml));
  Config raw = load_config("demo/tiny_full");
  if (raw.has("seed")) raw.remove("seed");
  EXPECT_EQ(parse_train_settings(raw, schema).seed, schema_seed);
  EXPECT_EQ(parse_train_settings(with_defaults(raw, schema), schema).seed, schema_seed);
  // Setup code handed a Config (model init, optimizer) reads the same default.
  EXPECT_EQ(config_seed(raw), schema_seed);
  EXPECT_EQ(config_seed(with_defaults(raw, schema)), schema_seed);
  raw.set("seed", YAML::Node(7));
  EXPECT_EQ(parse_train_settings(raw, schema).seed, 7u);
  EXPECT_EQ(config_seed(raw), 7u);
}

TEST(TrainSettings, DistributedKeysComeFromTheSchema) {
  const RecipeInfo& r = find_recipe("full_finetune_distributed");
  Config raw = load_config("demo/tiny_full");
  // What `fusetune run` gives the loop: overlap_grad_allreduce off unless set, ZeRO-0,
  // parameters resharded after the forward.
  const TrainSettings s = parse_train_settings(raw, *r.schema);
  EXPECT_EQ(s.overlap_grad_allreduce, std::optional<bool>(false));
  EXPECT_EQ(s.zero_stage, 0);
  EXPECT_TRUE(s.reshard_after_forward);
  raw.set("overlap_grad_allreduce", YAML::Node(true));
  raw.set("zero_stage", YAML::Node(1));
  const TrainSettings set = parse_train_settings(raw, *r.schema);
  EXPECT_EQ(set.overlap_grad_allreduce, std::optional<bool>(true));
  EXPECT_EQ(set.zero_stage, 1);
  // A single-device recipe has no such keys.
  EXPECT_FALSE(parse_train_settings(load_config("demo/tiny_full"), full_finetune_schema())
                   .overlap_grad_allreduce.has_value());
}

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

TEST(OptimizerBuilders, EveryValidatedOptimizerHasABuilder) {
  const ComponentTable* table = component_table("optimizer");
  ASSERT_NE(table, nullptr);
  for (const Component& c : table->components) {
    SCOPED_TRACE(c.name);
    EXPECT_TRUE(has_optimizer_builder(c.name));
    const Config cfg = Config::from_string(
        "seed: 3\noptimizer:\n  _component_: " + c.name + "\n  lr: 1e-3\n", "test.yaml");
    const std::unique_ptr<Optimizer> o = build_optimizer(cfg);
    ASSERT_NE(o, nullptr);
    const std::string kind = c.name == "PagedAdamW"       ? "AdamW"
                             : c.name == "PagedAdamW8bit" ? "AdamW8bit"
                                                          : c.name;
    EXPECT_EQ(o->name(), kind);
  }
  EXPECT_FALSE(has_optimizer_builder("Adafactor"));
}
