// torchtune's own configs (../shared/assets/torchtune_configs, unmodified) as fusetune reads
// them: the recipe each names, the Hub datasets they use, and `fusetune cp` of every name.
// The torchtune datasets' test copies in ../shared/assets/datasets stand in for the Hub.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "checks.h"
#include "cli_runner.h"
#include "engine_lookups.h"
#include "files.h"
#include "fusetune/config/builtin_configs.h"
#include "fusetune/config/config.h"
#include "fusetune/config/schema.h"
#include "fusetune/data/hub_datasets.h"
#include "fusetune/models/model_config.h"
#include "fusetune/recipes/recipe_inference.h"
#include "fusetune/recipes/recipe_setup.h"
#include "fusetune/recipes/registry.h"
#include "fusetune/util/error.h"
#include "test_support.h"

namespace {

namespace fs = std::filesystem;
using fusetune::Config;
using fusetune::testing::contains;
using fusetune::testing::is_registered_recipe;
using fusetune::testing::read_text;

struct TorchtuneConfig {
  std::string name;  // "llama3_2/1B_lora_single_device"
  fs::path path;
  std::string text;
};

std::vector<TorchtuneConfig> torchtune_configs(const std::string& folder = "torchtune_configs") {
  std::vector<TorchtuneConfig> out;
  const fs::path dir = fusetune::testing::assets_dir() / folder;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.path().extension() != ".yaml") continue;
    std::string rel = fs::relative(e.path(), dir).generic_string();
    out.push_back({rel.substr(0, rel.size() - 5), e.path(), read_text(e.path())});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return out;
}

TEST(TorchtuneConfigs, EveryConfigNamesItsRecipe) {
  FT_REQUIRE_ASSET("torchtune_configs/llama3_2/1B_lora_single_device.yaml");
  const auto configs = torchtune_configs();
  ASSERT_GE(configs.size(), 80u);
  std::map<std::string, int> by_recipe;
  int supported = 0;
  for (const auto& c : configs) {
    const Config cfg = Config::from_string(c.text, c.path.string());
    const fusetune::RecipeChoice r = fusetune::infer_recipe("", c.text, cfg, c.path.string());
    EXPECT_EQ(r.reason, "from the config's `tune run` line") << c.name;
    ++by_recipe[r.name];
    if (is_registered_recipe(r.name)) {
      ++supported;
      EXPECT_NO_THROW(fusetune::chosen_recipe(r)) << c.name;
      // The model builder alone (step 4) agrees for the fine-tuning recipes.
      if (r.name == "lora_finetune_single_device" || r.name == "full_finetune_single_device") {
        EXPECT_EQ(fusetune::infer_recipe("", "", cfg).name, r.name) << c.name;
      }
    } else {
      const std::string msg = fusetune::missing_torchtune_recipe(r.name);
      EXPECT_TRUE(contains(msg, "'" + r.name + "'") &&
                  contains(msg, "fusetune has no such recipe yet"))
          << c.name << ": " << r.name << " -> " << msg;
      try {
        fusetune::chosen_recipe(r);
        ADD_FAILURE() << c.name << ": no error for " << r.name;
      } catch (const fusetune::Error& e) {
        EXPECT_TRUE(contains(e.what(), "(from the config's `tune run` line)")) << e.what();
      }
    }
  }
  EXPECT_EQ(by_recipe["lora_finetune_single_device"], 20);
  EXPECT_EQ(by_recipe["full_finetune_single_device"], 10);
  EXPECT_EQ(by_recipe["lora_dpo_single_device"], 2);
  EXPECT_EQ(by_recipe["lora_finetune_distributed"], 20);
  EXPECT_EQ(by_recipe["knowledge_distillation_single_device"], 2);
  EXPECT_EQ(by_recipe["eleuther_eval"], 4);
  EXPECT_EQ(by_recipe["qat_single_device"], 3);
  EXPECT_EQ(by_recipe["full_finetune_distributed"], 13);
  EXPECT_EQ(by_recipe["qat_distributed"], 4);
  EXPECT_EQ(by_recipe["qat_lora_finetune_distributed"], 4);
  EXPECT_EQ(by_recipe["lora_dpo_distributed"], 2);
  EXPECT_EQ(by_recipe["full_dpo_distributed"], 1);
  EXPECT_EQ(by_recipe["knowledge_distillation_distributed"], 1);
  EXPECT_EQ(by_recipe["ppo_full_finetune_single_device"], 2);
  EXPECT_EQ(supported, 84);
  std::string summary;
  for (const auto& [name, n] : by_recipe)
    summary += "  " + name + (is_registered_recipe(name) ? "" : " (not in fusetune)") + ": " +
               std::to_string(n) + "\n";
  std::printf("torchtune configs by recipe:\n%s", summary.c_str());
}

TEST(TorchtuneConfigs, EveryDatasetBuilderTheyUseIsInTheTable) {
  FT_REQUIRE_ASSET("torchtune_configs/llama3_2/1B_lora_single_device.yaml");
  std::set<std::string> used;
  for (const auto& c : torchtune_configs()) {
    Config cfg = Config::from_string(c.text, c.path.string());
    if (!cfg.has("dataset._component_")) continue;
    const std::string comp = cfg.str("dataset._component_");
    used.insert(comp);
    const fusetune::DatasetBuilder* b = fusetune::find_dataset_builder(comp);
    ASSERT_NE(b, nullptr) << c.name << ": " << comp;
    // As pasted: the Hub dataset is named with the key to set.
    try {
      fusetune::apply_dataset_builders(cfg);
      ADD_FAILURE() << c.name << ": no error for " << comp;
    } catch (const fusetune::Error& e) {
      const std::string hub = b->hub_source.empty() ? cfg.str("dataset.source") : b->hub_source;
      EXPECT_TRUE(contains(e.what(), "Hugging Face Hub dataset " + hub)) << e.what();
      EXPECT_TRUE(contains(e.what(), "dataset.source=/path/to/local/copy.json")) << e.what();
    }
    // With a local copy: fusetune's kind.
    Config local = Config::from_string(c.text, c.path.string());
    local.apply_overrides({"dataset.source=/data/copy.json"});
    if (local.has("dataset_val")) local.apply_overrides({"dataset_val.source=/data/val.json"});
    fusetune::apply_dataset_builders(local);
    EXPECT_EQ(fusetune::canonical_component(local, "dataset"), b->kind) << c.name;
  }
  EXPECT_TRUE(used.count("torchtune.datasets.alpaca_cleaned_dataset"));
  EXPECT_TRUE(used.count("torchtune.datasets.stack_exchange_paired_dataset"));
}

// torchtune's test copies of the Hub datasets, read through the builders' column maps.
TEST(TorchtuneConfigs, HubBuildersReadLocalCopies) {
  FT_REQUIRE_ASSET("datasets/stack_exchange_paired_tiny.json");
  FT_REQUIRE_ASSET("datasets/hh_rlhf_tiny.json");
  FT_REQUIRE_ASSET("datasets/alpaca_tiny.json");
  const fs::path data = fusetune::testing::assets_dir() / "datasets";
  fusetune::ModelConfig model;
  model.model_type = "llama";
  auto config = [&](const std::string& builder, const fs::path& file) {
    Config c = Config::from_string(
        "tokenizer: {_component_: byte}\ndataset: {_component_: "
        "torchtune.datasets." +
            builder + ", source: " + file.string() + ", max_seq_len: 100000}\n",
        "t.yaml");
    fusetune::apply_dataset_builders(c);
    return c;
  };
  Config c = config("stack_exchange_paired_dataset", data / "stack_exchange_paired_tiny.json");
  auto tok = fusetune::build_tokenizer(c);
  auto pairs = fusetune::build_preference_dataset_from_config(c, *tok, model);
  EXPECT_GT(pairs->size(), 0);
  c = config("hh_rlhf_helpful_dataset", data / "hh_rlhf_tiny.json");
  pairs = fusetune::build_preference_dataset_from_config(c, *tok, model);
  ASSERT_EQ(pairs->size(), 1);
  EXPECT_TRUE(contains(tok->decode(pairs->get(0).chosen.tokens, false), "Fix the hole."));
  EXPECT_TRUE(contains(tok->decode(pairs->get(0).rejected.tokens, false), "Take them off."));
  c = config("alpaca_cleaned_dataset", data / "alpaca_tiny.json");
  auto ds = fusetune::build_dataset_from_config(c, *tok, model);
  EXPECT_GT(ds->size(), 0);
}

// torchtune_configs_next's family folders (issue 29's) as the test above reads torchtune_configs:
// every config names its recipe on its `tune run` line, and fusetune has it, or, for the
// evaluation.yaml of gemma/, phi3/ and phi4/ (torchtune's eleuther_eval, lm-evaluation-harness),
// `fusetune validate` refuses it exactly as it refuses Llama 3.2's evaluation.yaml: naming the
// recipe and `fusetune eval`, the closest one.
TEST(TorchtuneConfigs, NextConfigsNameTheirRecipesAsTodaysDo) {
  FT_REQUIRE_ASSET("torchtune_configs_next/phi3/evaluation.yaml");
  FT_REQUIRE_ASSET("torchtune_configs/llama3_2/evaluation.yaml");
  const auto refusal = [](const fs::path& config) {
    const auto r = fusetune::testing::run_fusetune("validate " + config.string());
    EXPECT_EQ(r.code, 1) << r.out;
    return r.out.substr(r.out.find("recipe 'eleuther_eval'"));
  };
  const std::string llama =
      refusal(fusetune::testing::assets_dir() / "torchtune_configs/llama3_2/evaluation.yaml");
  EXPECT_TRUE(contains(llama, "fusetune has no such recipe yet (the closest is eval")) << llama;
  std::map<std::string, int> by_recipe;
  for (const auto& c : torchtune_configs("torchtune_configs_next")) {
    if (c.name.rfind("dev/", 0) == 0) continue;  // torchtune's dev recipes: no family folder
    const Config cfg = Config::from_string(c.text, c.path.string());
    const fusetune::RecipeChoice r = fusetune::infer_recipe("", c.text, cfg, c.path.string());
    EXPECT_EQ(r.reason, "from the config's `tune run` line") << c.name;
    ++by_recipe[r.name];
    if (is_registered_recipe(r.name)) {
      EXPECT_NO_THROW(fusetune::chosen_recipe(r)) << c.name;
      continue;
    }
    EXPECT_EQ(r.name, "eleuther_eval") << c.name;
    EXPECT_EQ(refusal(c.path), llama) << c.name;
  }
  EXPECT_EQ(by_recipe["eleuther_eval"], 3);  // gemma, phi3, phi4
}

// `fusetune cp NAME` copies each of torchtune's configs fusetune has no built-in config for,
// byte for byte, and says when fusetune has no recipe for it.
TEST(TorchtuneConfigs, CpCopiesEveryTorchtuneName) {
  FT_REQUIRE_ASSET("torchtune_configs/llama3_2/1B_lora_single_device.yaml");
  fusetune::testing::TempDir dir;
  const std::string env = "FUSETUNE_ASSETS='" + fusetune::testing::assets_dir().string() + "' ";
  int copied = 0, noted = 0;
  for (const auto& c : torchtune_configs()) {
    if (fusetune::find_builtin_config(c.name)) continue;
    const fs::path dest = dir / (std::to_string(copied) + ".yaml");
    const auto r = fusetune::testing::run_fusetune("cp " + c.name + " " + dest.string(),
                                                   dir.path().string(), env);
    ASSERT_NE(r.out, "popen failed");
    const std::string& out = r.out;
    EXPECT_EQ(r.code, 0) << c.name << ": " << out;
    EXPECT_EQ(read_text(dest), c.text) << c.name;
    ++copied;
    const std::string recipe = fusetune::tune_run_recipe(c.text, c.name);
    const bool missing = !fusetune::missing_torchtune_recipe(recipe).empty();
    EXPECT_EQ(contains(out, "fusetune has no such recipe yet"), missing) << c.name << ": " << out;
    if (missing) {
      ++noted;
      EXPECT_TRUE(contains(out, "'" + recipe + "'")) << out;
    } else {
      EXPECT_TRUE(contains(out, "Run it with: fusetune run " + recipe)) << out;
    }
  }
  // Most torchtune configs (74 of 91) have no built-in twin; since the *_distributed recipes
  // (QAT, DPO and knowledge distillation included) and PPO exist, a minority (7 of those
  // copied) name a recipe fusetune lacks (eval, generation, quantize, ...).
  EXPECT_GT(copied, 70);
  EXPECT_GE(noted, 7);
}

// torchtune's llama3_2/1B_lora_single_device.yaml, unmodified, planned and trained with
// overrides that point it at local files: stories260K for the model and alpaca_tiny.json (a
// copy of Alpaca rows) for its alpaca_cleaned_dataset. `plan` finds the recipe itself.
TEST(TorchtuneConfigs, PastedLoraConfigPlansAndTrainsWithLocalFiles) {
  FT_REQUIRE_ASSET("torchtune_configs/llama3_2/1B_lora_single_device.yaml");
  FT_REQUIRE_ASSET("stories260K/model.safetensors");
  FT_REQUIRE_ASSET("datasets/alpaca_tiny.json");
  const fs::path a = fusetune::testing::assets_dir();
  fusetune::testing::TempDir dir;
  const std::string config = (a / "torchtune_configs/llama3_2/1B_lora_single_device.yaml").string();
  const std::string local =
      " dataset.source=" + (a / "datasets/alpaca_tiny.json").string() +
      " checkpointer.checkpoint_dir=" + (a / "stories260K").string() +
      " 'checkpointer.checkpoint_files=[model.safetensors]' checkpointer.model_type=LLAMA2" +
      " tokenizer.path=" + (a / "stories260K/tokenizer.json").string() +
      " tokenizer.max_seq_len=128 output_dir=" + (dir / "out").string();
  // As pasted: the recipe from its `tune run` line, then the Hub dataset it needs.
  auto r = fusetune::testing::run_fusetune("plan --config " + config);
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out,
                       "recipe lora_finetune_single_device (from the config's `tune run` "
                       "line)"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "Hugging Face Hub dataset yahma/alpaca-cleaned")) << r.out;
  r = fusetune::testing::run_fusetune("plan --config " + config + local);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "recipe lora_finetune_single_device: llama model")) << r.out;
  r = fusetune::testing::run_fusetune("run lora_finetune_single_device --config " + config + local +
                                      " max_steps_per_epoch=2 batch_size=2 epochs=1");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "dataset:          alpaca_tiny.json: 100 examples")) << r.out;
  EXPECT_TRUE(contains(r.out, "Step 2 | loss:")) << r.out;
  EXPECT_TRUE(fs::exists(dir / "out/epoch_0"));
}

}  // namespace
