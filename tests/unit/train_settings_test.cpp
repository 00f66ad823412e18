// The training loop's typed settings (recipes/train_settings.h): every default comes from the
// recipe's schema, so a config read with or without the schema's defaults applied gives the
// same settings, and `seed` has one default.
#include <gtest/gtest.h>

#include "fusetune/config/builtin_configs.h"
#include "fusetune/config/recipe_schemas.h"
#include "fusetune/config/schema.h"
#include "fusetune/recipes/registry.h"
#include "fusetune/recipes/train_settings.h"

using namespace fusetune;

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
