// The built-in configs: embedded, each names a known recipe, each validates against it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "checks.h"
#include "fusetune/config/builtin_configs.h"
#include "fusetune/config/recipe_schemas.h"
#include "fusetune/config/schema.h"
#include "fusetune/recipes/registry.h"
#include "fusetune/util/error.h"
#include "test_support.h"

using namespace fusetune;
using fusetune::testing::error_of;

namespace {}  // namespace

TEST(ConfigBuiltin, TheExpectedConfigsAreEmbedded) {
  for (const char* name :
       {"demo/tiny_full", "stories260K/full_single_device", "llama3_2/1B_full_single_device",
        "llama3_1/8B_full_single_device", "qwen2_5/0.5B_full_single_device",
        "mistral/7B_full_single_device", "llama2/7B_full_single_device",
        "llama3_2/1B_lora_single_device", "llama3_2/1B_qlora_single_device"}) {
    EXPECT_NE(find_builtin_config(name), nullptr) << name;
  }
  EXPECT_EQ(find_builtin_config("llama3_2/1B_full_single_device.yaml"), nullptr);
}

TEST(ConfigBuiltin, EmbeddedTextMatchesTheSourceTree) {
  namespace fs = std::filesystem;
  fs::path root = fs::path(::fusetune::testing::source_dir()) / "configs";
  size_t on_disk = 0;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (e.path().extension() != ".yaml") continue;
    ++on_disk;
    std::string name = fs::relative(e.path(), root).replace_extension().generic_string();
    const BuiltinConfig* b = find_builtin_config(name);
    ASSERT_NE(b, nullptr) << name << " is not embedded";
    std::ifstream in(e.path(), std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    EXPECT_EQ(std::string(b->text), ss.str()) << name;
  }
  EXPECT_EQ(on_disk, builtin_configs().size());
}

TEST(ConfigBuiltin, EveryConfigNamesAKnownRecipeAndValidates) {
  ASSERT_FALSE(builtin_configs().empty());
  for (const auto& b : builtin_configs()) {
    SCOPED_TRACE(b.name);
    ASSERT_FALSE(b.recipe.empty()) << "missing a '# recipe: NAME' line";
    const RecipeInfo& r = find_recipe(b.recipe);
    Config c = load_config(b.name);
    EXPECT_EQ(c.source(), "configs/" + b.name + ".yaml");
    std::vector<std::string> warnings;
    EXPECT_NO_THROW(validate(c, *r.schema, &warnings));
    EXPECT_TRUE(warnings.empty());
    Config f = with_defaults(c, *r.schema);
    EXPECT_NO_THROW(validate(f, *r.schema));
    for (const Field& field : r.schema->fields) {  // training recipes need one
      if (field.name == "output_dir" && field.required) {
        EXPECT_FALSE(f.str("output_dir").empty());
      }
    }
  }
}

TEST(ConfigBuiltin, EveryRecipeHasAConfig) {
  for (const auto& r : recipes()) {
    bool found = false;
    for (const auto& b : builtin_configs()) found = found || b.recipe == r.name;
    EXPECT_TRUE(found) << r.name;
  }
}

TEST(ConfigBuiltin, DemoIsSelfContained) {
  Config c = load_config("demo/tiny_full");
  Config f = with_defaults(c, *find_recipe("full_finetune_single_device").schema);
  EXPECT_EQ(f.str("model.init"), "random");
  EXPECT_EQ(f.str("tokenizer._component_"), "byte");
  EXPECT_EQ(f.str("dataset._component_"), "text_completion");
  EXPECT_FALSE(f.has("checkpointer"));
}

TEST(ConfigBuiltin, LoadConfigFromFileOrNameWithSuggestions) {
  fusetune::testing::TempDir dir;
  std::string path = (dir / "mine.yaml").string();
  std::ofstream(path) << "output_dir: /o\n";
  EXPECT_EQ(load_config(path).str("output_dir"), "/o");
  EXPECT_EQ(error_of([] { load_config("llama3_2/1B_ful_single_device"); }),
            "config 'llama3_2/1B_ful_single_device' is neither a file nor a built-in config "
            "(did you mean 'llama3_2/1B_full_single_device'?)");
  EXPECT_NE(error_of([] {
              load_config("/nowhere/configs/demo/tiny_full.yaml");
            }).find("did you mean 'demo/tiny_full'?"),
            std::string::npos);
  EXPECT_NE(error_of([] { load_config("zzzzzzzzzzzzzzzzzzzz"); }).find("fusetune ls"),
            std::string::npos);
}

TEST(ConfigBuiltin, RecipeComment) {
  EXPECT_EQ(recipe_comment("# Title\n# recipe: full_finetune_single_device\n\na: 1\n"),
            "full_finetune_single_device");
  EXPECT_EQ(recipe_comment("a: 1\n# recipe: x\n"), "");  // only the leading comment block
  EXPECT_EQ(recipe_comment(""), "");
}

TEST(RecipeRegistry, FindRecipe) {
  EXPECT_EQ(find_recipe("full_finetune_single_device").name, "full_finetune_single_device");
  EXPECT_EQ(find_recipe("lora_finetune_single_device.py").name, "lora_finetune_single_device");
  EXPECT_NE(find_recipe("full_finetune_single_device").schema, nullptr);
  EXPECT_EQ(error_of([] { find_recipe("full_finetune_single_devce"); }),
            "unknown recipe 'full_finetune_single_devce' (did you mean "
            "'full_finetune_single_device'?); recipes: full_finetune_single_device, "
            "lora_finetune_single_device, lora_dpo_single_device, full_dpo_single_device, "
            "knowledge_distillation_single_device, "
            "qat_single_device, qat_lora_finetune_single_device, full_finetune_distributed, "
            "lora_finetune_distributed, qat_distributed, qat_lora_finetune_distributed, "
            "lora_dpo_distributed, full_dpo_distributed, knowledge_distillation_distributed, "
            "grpo_full_finetune_single_device, lora_grpo_finetune_single_device, "
            "grpo_full_finetune_distributed, lora_grpo_finetune_distributed, "
            "ppo_full_finetune_single_device, ppo_full_finetune_distributed, "
            "reward_model_finetune_single_device, lora_reward_model_finetune_single_device, "
            "reward_model_finetune_distributed, generate, eval");
}

TEST(RecipeSchemas, LossesAndDatasetsBelongToTheirRecipes) {
  auto problems = [](const Schema& s, const std::string& loss, const std::string& data) {
    Config c = Config::from_string(
        "output_dir: /tmp/x\nmodel:\n  init: random\n  vocab_size: 8\n  hidden_size: 8\n"
        "  intermediate_size: 8\n  num_hidden_layers: 1\n  num_attention_heads: 2\n"
        "  lora_attn_modules: [q_proj]\n"
        "tokenizer:\n  _component_: byte\ndataset:\n  _component_: " +
            data +
            "\n  source: x.json\noptimizer:\n  _component_: AdamW\n  lr: 1e-3\n"
            "loss:\n  _component_: " +
            loss + "\n",
        "t.yaml");
    std::string all;
    for (const auto& e : check_config(c, s).errors) all += e + "\n";
    return all;
  };
  EXPECT_EQ(problems(lora_dpo_schema(), "torchtune.rlhf.loss.DPOLoss", "preference"), "");
  EXPECT_EQ(problems(lora_dpo_schema(), "simpo", "preference"), "");
  EXPECT_NE(problems(lora_dpo_schema(), "cross_entropy", "preference").find("preference loss"),
            std::string::npos);
  EXPECT_NE(problems(lora_dpo_schema(), "DPOLoss", "alpaca").find("needs preference pairs"),
            std::string::npos);
  EXPECT_NE(problems(lora_finetune_schema(), "DPOLoss", "alpaca").find("lora_dpo_single_device"),
            std::string::npos);
  EXPECT_NE(problems(lora_finetune_schema(), "cross_entropy", "preference")
                .find("preference pairs belong to the DPO recipes"),
            std::string::npos);
}
