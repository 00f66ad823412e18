// Which recipe a config is for (recipes/recipe_inference.h), and the CLI around it: validate
// and plan find and print it; recipes fusetune lacks are named; cp takes torchtune's names.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "checks.h"
#include "cli_runner.h"
#include "fusetune/config/config.h"
#include "fusetune/recipes/recipe_inference.h"
#include "fusetune/recipes/registry.h"
#include "fusetune/util/error.h"
#include "test_support.h"

namespace {

namespace fs = std::filesystem;
using fusetune::Config;
using fusetune::infer_recipe;
using fusetune::tune_run_recipe;
using fusetune::testing::contains;

Config empty_config() { return Config::from_string("output_dir: /o\n", "t.yaml"); }

TEST(RecipeInference, TuneRunLineSkipsLauncherOptions) {
  EXPECT_EQ(tune_run_recipe("# To launch:\n#   tune run lora_finetune_single_device --config "
                            "llama3_2/1B_lora_single_device\nx: 1\n"),
            "lora_finetune_single_device");
  EXPECT_EQ(tune_run_recipe("#   tune run --nproc_per_node 2 full_finetune_distributed "
                            "--config llama3_1/8B_full\n"),
            "full_finetune_distributed");
  EXPECT_EQ(tune_run_recipe("#   tune run --nnodes 1 --nproc_per_node 2 lora_dpo_distributed "
                            "--config x\n"),
            "lora_dpo_distributed");
  EXPECT_EQ(tune_run_recipe("# tune run --nnodes=1 --standalone full_finetune_distributed.py\n"),
            "full_finetune_distributed");
  EXPECT_EQ(tune_run_recipe("#   # tune run --nproc_per_node 8 lora_finetune_distributed\n"),
            "lora_finetune_distributed");
  EXPECT_EQ(tune_run_recipe("# fusetune run full_dpo_single_device --config x.yaml\n"),
            "full_dpo_single_device");
  EXPECT_EQ(tune_run_recipe("#    tune run dev/generate_v2 --config llama2/generation_v2\n"),
            "dev/generate_v2");
  // Only the leading comment block; `tune download` is not a run line.
  EXPECT_EQ(tune_run_recipe("# tune download meta-llama/x\nseed: 1\n# tune run eval\n"), "");
  EXPECT_EQ(tune_run_recipe("# tune run --config x.yaml\n"), "");
  // A preparation step first (a distillation teacher's fine-tune): the line whose --config
  // names this config wins, else the last one.
  const std::string kd =
      "#   tune run lora_finetune_single_device --config qwen2_5/14B_lora_single_device\n"
      "#   tune run knowledge_distillation_single_device --config qwen2_5/14B_to_7B_KD\n";
  EXPECT_EQ(tune_run_recipe(kd), "knowledge_distillation_single_device");
  EXPECT_EQ(tune_run_recipe(kd, "../assets/qwen2_5/14B_lora_single_device.yaml"),
            "lora_finetune_single_device");
  EXPECT_EQ(tune_run_recipe(kd, "my_kd.yaml"), "knowledge_distillation_single_device");
}

TEST(RecipeInference, OrderOfTheSources) {
  const std::string text =
      "# recipe: full_dpo_single_device\n# tune run lora_finetune_single_device --config x\n";
  const Config lora = Config::from_string(
      "model: {_component_: torchtune.models.llama3_2.lora_llama3_2_1b}\n", "t.yaml");
  auto r = infer_recipe("full_finetune_single_device", text, lora);
  EXPECT_EQ(r.name, "full_finetune_single_device");
  EXPECT_EQ(r.reason, "given on the command line");
  r = infer_recipe("", text, lora);
  EXPECT_EQ(r.name, "full_dpo_single_device");
  EXPECT_EQ(r.reason, "from the config's `# recipe:` line");
  r = infer_recipe("", "# tune run lora_finetune_single_device --config x\n", lora);
  EXPECT_EQ(fusetune::describe(r),
            "recipe lora_finetune_single_device (from the config's `tune run` line)");
  r = infer_recipe("", "# fusetune run full_finetune_single_device --config x\n", lora);
  EXPECT_EQ(r.reason, "from the config's `fusetune run` line");
  r = infer_recipe("", "", lora);
  EXPECT_EQ(r.name, "lora_finetune_single_device");
  EXPECT_EQ(r.reason, "from the model component torchtune.models.llama3_2.lora_llama3_2_1b");
  r = infer_recipe(
      "", "",
      Config::from_string("model: {_component_: torchtune.models.llama3_1.qlora_llama3_1_8b}\n",
                          "t.yaml"));
  EXPECT_EQ(r.name, "lora_finetune_single_device");
  r = infer_recipe("", "",
                   Config::from_string(
                       "model: {_component_: torchtune.models.qwen2_5.qwen2_5_0_5b}\n", "t.yaml"));
  EXPECT_EQ(r.name, "full_finetune_single_device");
  r = infer_recipe("", "", Config::from_string("model: {init: random, lora_rank: 8}\n", "t.yaml"));
  EXPECT_EQ(r.name, "lora_finetune_single_device");
  r = infer_recipe("", "", empty_config());
  EXPECT_EQ(r.name, "full_finetune_single_device");
}

TEST(RecipeInference, TorchtuneRecipesFusetuneLacksAreNamed) {
  using fusetune::missing_torchtune_recipe;
  EXPECT_EQ(missing_torchtune_recipe("lora_finetune_single_device"), "");
  EXPECT_EQ(missing_torchtune_recipe("no_such_thing"), "");
  std::string m = missing_torchtune_recipe("dev/generate_v2_distributed");
  EXPECT_TRUE(
      contains(m,
               "recipe 'dev/generate_v2_distributed' is one of torchtune's recipes; fusetune "
               "has no such recipe yet"))
      << m;
  EXPECT_TRUE(contains(m, "the closest is generate")) << m;
  // The data-parallel recipes fusetune has are not missing.
  EXPECT_EQ(missing_torchtune_recipe("full_finetune_distributed"), "");
  EXPECT_EQ(missing_torchtune_recipe("lora_finetune_distributed.py"), "");
  EXPECT_EQ(missing_torchtune_recipe("lora_dpo_distributed.py"), "");
  EXPECT_EQ(missing_torchtune_recipe("full_dpo_distributed"), "");
  EXPECT_EQ(missing_torchtune_recipe("qat_lora_finetune_distributed"), "");
  EXPECT_EQ(missing_torchtune_recipe("qat_distributed.py"), "");
  EXPECT_EQ(missing_torchtune_recipe("knowledge_distillation_distributed"), "");
  EXPECT_EQ(missing_torchtune_recipe("qat_single_device"), "");  // fusetune has it
  EXPECT_TRUE(contains(missing_torchtune_recipe("eleuther_eval"), "closest is eval"));
  EXPECT_EQ(missing_torchtune_recipe("ppo_full_finetune_single_device"), "");  // fusetune has it
  for (const char* none : {"quantize"}) {
    m = missing_torchtune_recipe(none);
    EXPECT_TRUE(contains(m, std::string("recipe '") + none + "'")) << m;
    EXPECT_TRUE(contains(m, "nor a single-device recipe close to it")) << m;
  }
  // An unknown *_distributed recipe still counts as a missing torchtune one.
  EXPECT_TRUE(contains(missing_torchtune_recipe("foo_distributed"), "no such recipe yet"));
  // `fusetune run` with such a name says so too.
  try {
    fusetune::find_recipe("dev/generate_v2_distributed");
    ADD_FAILURE() << "no error";
  } catch (const fusetune::Error& e) {
    EXPECT_TRUE(contains(e.what(), "fusetune has no such recipe yet")) << e.what();
  }
  const fusetune::RecipeChoice c{"dev/generate_v2_distributed",
                                 "from the config's `tune run` line"};
  try {
    fusetune::chosen_recipe(c);
    ADD_FAILURE() << "no error";
  } catch (const fusetune::Error& e) {
    EXPECT_TRUE(contains(e.what(),
                         "recipe 'dev/generate_v2_distributed' (from the config's "
                         "`tune run` line)"))
        << e.what();
  }
}

using fusetune::testing::run_fusetune;

TEST(RecipeInferenceCli, ValidateFindsAndPrintsTheRecipe) {
  fusetune::testing::TempDir dir;
  const fs::path cfg = dir / "tt.yaml";
  std::ofstream(cfg) << "# To launch on a single device:\n"
                        "#   tune run full_finetune_single_device --config my/cfg\n\n"
                        "output_dir: /tmp/o\nmodel: {init: random, vocab_size: 259, hidden_size: "
                        "8, intermediate_size: 16, num_hidden_layers: 1, num_attention_heads: 2}\n"
                        "tokenizer: {_component_: byte}\n"
                        "dataset: {_component_: text_completion, source: t.txt}\n"
                        "optimizer: {_component_: torch.optim.AdamW, lr: 1e-4}\n";
  auto r = run_fusetune("validate " + cfg.string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out,
            "recipe full_finetune_single_device (from the config's `tune run` line)\n"
            "Config is well-formed!\n");
  r = run_fusetune("validate " + cfg.string() + " --recipe full_finetune_single_device");
  EXPECT_TRUE(contains(r.out, "recipe full_finetune_single_device (given on the command line)"))
      << r.out;

  const fs::path dist = dir / "dist.yaml";
  std::ofstream(dist) << "#   tune run --nproc_per_node 2 dev/generate_v2_distributed "
                         "--config x\n"
                         "output_dir: /tmp/o\n";
  r = run_fusetune("validate " + dist.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out,
                       "recipe 'dev/generate_v2_distributed' (from the config's `tune run` "
                       "line) is one of torchtune's recipes; fusetune has no such recipe yet"))
      << r.out;

  // A Hub dataset builder without a local source.
  const fs::path hub = dir / "hub.yaml";
  std::ofstream(hub) << "#   tune run full_finetune_single_device --config x\n"
                        "output_dir: /tmp/o\nmodel: {init: random, vocab_size: 259, hidden_size: "
                        "8, intermediate_size: 16, num_hidden_layers: 1, num_attention_heads: 2}\n"
                        "tokenizer: {_component_: byte}\n"
                        "dataset: {_component_: torchtune.datasets.alpaca_cleaned_dataset}\n"
                        "optimizer: {_component_: torch.optim.AdamW, lr: 1e-4}\n";
  r = run_fusetune("validate " + hub.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "Hugging Face Hub dataset yahma/alpaca-cleaned")) << r.out;
  EXPECT_TRUE(contains(r.out, "dataset.source=/path/to/local/copy.json")) << r.out;
  std::ofstream(dir / "a.json") << "[]";
  r = run_fusetune("validate " + hub.string() + " dataset.source=" + (dir / "a.json").string());
  EXPECT_EQ(r.code, 0) << r.out;
}

// The recipe line is a line of its own: the validation's warnings, its errors and the verdict
// each start on the next line (stdout and stderr together, as a terminal shows them).
TEST(RecipeInferenceCli, ValidatePrintsTheRecipeOnALineOfItsOwn) {
  fusetune::testing::TempDir dir;
  const fs::path cfg = dir / "tt.yaml";
  std::ofstream(cfg) << "#   tune run full_finetune_single_device --config my/cfg\n"
                        "output_dir: /tmp/o\nmodel: {init: random, vocab_size: 259, hidden_size: "
                        "8, intermediate_size: 16, num_hidden_layers: 1, num_attention_heads: 2}\n"
                        "tokenizer: {_component_: byte}\n"
                        "dataset: {_component_: text_completion, source: t.txt}\n"
                        "optimizer: {_component_: torch.optim.AdamW, lr: 1e-4}\n";
  const std::string recipe_line =
      "recipe full_finetune_single_device (from the config's `tune run` line)\n";
  auto r = run_fusetune("validate " + cfg.string() +
                        " loss._component_=torchtune.modules.loss.CEWithChunkedOutputLoss"
                        " loss.num_output_chunks=8");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out, recipe_line +
                       "fusetune: warning: config key 'loss.num_output_chunks' is ignored: "
                       "fusetune chooses the chunking of the fused loss itself\n"
                       "Config is well-formed!\n");
  r = run_fusetune("validate " + cfg.string() + " optimizer.lrr=1");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_EQ(r.out, recipe_line + "fusetune: error: " + cfg.string() +
                       ": 1 problem in the config for recipe full_finetune_single_device:\n"
                       "  - unknown config key 'optimizer.lrr' (did you mean 'optimizer.lr'?) "
                       "(override 'optimizer.lrr=1')\n");
}

TEST(RecipeInferenceCli, PlanTakesTheConfigAlone) {
  auto r = run_fusetune("plan --config demo/tiny_full");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out,
                       "recipe full_finetune_single_device (from the config's `# recipe:` "
                       "line)\nrecipe full_finetune_single_device: "))
      << r.out;
  r = run_fusetune("plan full_finetune_single_device --config demo/tiny_full");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "(given on the command line)")) << r.out;
  r = run_fusetune("plan --recipe full_finetune_single_device --config demo/tiny_full");
  EXPECT_EQ(r.code, 0) << r.out;
  r = run_fusetune("plan --config demo/tiny_generation");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "plan predicts a training step")) << r.out;
  r = run_fusetune("plan demo/tiny_full");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "missing --config")) << r.out;
}

TEST(RecipeInferenceCli, CpCopiesTorchtuneConfigsFromTheAssetsFolder) {
  // One TempDir per test (a second would reuse and empty the same path).
  fusetune::testing::TempDir tmp;
  const fs::path assets = tmp / "assets", out = tmp / "out";
  fs::create_directories(assets / "torchtune_configs/fam");
  fs::create_directories(out);
  const std::string dist =
      "#   tune run --nproc_per_node 2 dev/generate_v2_distributed --config "
      "fam/7B_lora\noutput_dir: /o\n"
      "dataset: {_component_: torchtune.datasets.alpaca_cleaned_dataset}\n";
  std::ofstream(assets / "torchtune_configs/fam/7B_lora.yaml") << dist;
  std::ofstream(assets / "torchtune_configs/fam/7B_lora_single_device.yaml")
      << "#   tune run lora_finetune_single_device --config fam/7B_lora_single_device\n";
  const char* old = std::getenv("FUSETUNE_ASSETS");
  const std::string saved = old ? old : "";
  setenv("FUSETUNE_ASSETS", assets.c_str(), 1);
  auto r = run_fusetune("cp fam/7B_lora " + (out / "a.yaml").string(), out.string());
  EXPECT_EQ(r.code, 0) << r.out;
  std::ifstream in(out / "a.yaml");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), dist);
  EXPECT_TRUE(contains(r.out, "torchtune's config fam/7B_lora")) << r.out;
  EXPECT_TRUE(contains(r.out, "recipe 'dev/generate_v2_distributed'")) << r.out;
  EXPECT_TRUE(contains(r.out, "fusetune has no such recipe yet")) << r.out;
  EXPECT_TRUE(contains(r.out,
                       "Its dataset reads the Hugging Face Hub dataset yahma/alpaca-cleaned: "
                       "download it and set dataset.source=/path/to/local/copy.json"))
      << r.out;
  r = run_fusetune("cp fam/7B_lora_single_device " + out.string(), out.string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(out / "7B_lora_single_device.yaml"));
  EXPECT_TRUE(contains(r.out, "Run it with: fusetune run lora_finetune_single_device")) << r.out;
  r = run_fusetune("cp fam/7B_lra " + (out / "b.yaml").string(), out.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "did you mean 'fam/7B_lora'?")) << r.out;
  // ls counts them (and lists them with --verbose).
  r = run_fusetune("ls --verbose", out.string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(
      contains(r.out, "2 of torchtune's configs in " + (assets / "torchtune_configs").string()))
      << r.out;
  EXPECT_TRUE(contains(r.out, "dev/generate_v2_distributed (not in fusetune yet)")) << r.out;
  // A built-in config of the same name wins.
  fs::create_directories(assets / "torchtune_configs/demo");
  std::ofstream(assets / "torchtune_configs/demo/tiny_full.yaml") << "not: this\n";
  r = run_fusetune("cp demo/tiny_full " + (out / "c.yaml").string(), out.string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_FALSE(contains(r.out, "torchtune's config")) << r.out;
  if (old)
    setenv("FUSETUNE_ASSETS", saved.c_str(), 1);
  else
    unsetenv("FUSETUNE_ASSETS");
  // Without any folder the message says where they are looked for.
  r = run_fusetune("cp fam/7B_lora " + (out / "d.yaml").string(), out.string());
  if (!fs::exists(out / "../shared/assets/torchtune_configs")) {
    EXPECT_TRUE(contains(r.out, "neither exists here")) << r.out;
  }
}

}  // namespace
