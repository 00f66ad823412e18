// torchtune's dataset builders (data/hub_datasets.h): the Hub dataset each names, the error
// without a local source, and the columns applied to a local copy.
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "checks.h"
#include "data_test_util.h"
#include "fusetune/config/config.h"
#include "fusetune/config/recipe_schemas.h"
#include "fusetune/config/schema.h"
#include "fusetune/data/hub_datasets.h"
#include "fusetune/models/model_config.h"
#include "fusetune/recipes/recipe_setup.h"
#include "fusetune/util/error.h"
#include "test_support.h"

namespace {

using fusetune::Config;
using fusetune::Error;
using fusetune::testing::contains;
using fusetune::testing::error_of;

// The error of applying the dataset builders to `cfg` ("" when none).
std::string builders_error(Config cfg) {
  return error_of([&] { fusetune::apply_dataset_builders(cfg); });
}

Config dataset_config(const std::string& dataset_yaml) {
  return Config::from_string("dataset:\n" + dataset_yaml, "test.yaml");
}

TEST(HubDatasets, TableNamesTorchtunesDefaultSources) {
  std::set<std::string> names;
  for (const auto& b : fusetune::dataset_builders()) {
    EXPECT_TRUE(names.insert(b.name).second) << "duplicate " << b.name;
    EXPECT_FALSE(b.kind.empty()) << b.name;
  }
  auto hub = [](const char* name) { return fusetune::find_dataset_builder(name)->hub_source; };
  EXPECT_EQ(hub("torchtune.datasets.alpaca_cleaned_dataset"), "yahma/alpaca-cleaned");
  EXPECT_EQ(hub("alpaca_dataset"), "tatsu-lab/alpaca");
  EXPECT_EQ(hub("torchtune.datasets.slimorca_dataset"), "Open-Orca/SlimOrca-Dedup");
  EXPECT_EQ(hub("torchtune.datasets.stack_exchange_paired_dataset"),
            "lvwerra/stack-exchange-paired");
  EXPECT_EQ(hub("torchtune.datasets.samsum_dataset"), "Samsung/samsum");
  EXPECT_EQ(hub("chat_dataset"), "");
  EXPECT_EQ(fusetune::find_dataset_builder("torchtune.datasets.no_such_dataset"), nullptr);
  EXPECT_EQ(fusetune::find_dataset_builder("alpaca"), nullptr);  // fusetune's own kind
}

TEST(HubDatasets, EveryHubBuilderWithoutSourceNamesTheDatasetAndTheKey) {
  for (const auto& b : fusetune::dataset_builders()) {
    if (b.hub_source.empty()) continue;
    const std::string msg =
        builders_error(dataset_config("  _component_: torchtune.datasets." + b.name + "\n"));
    EXPECT_TRUE(contains(msg, "Hugging Face Hub dataset " + b.hub_source)) << msg;
    EXPECT_TRUE(contains(msg, "dataset.source=/path/to/local/copy.json")) << msg;
    EXPECT_TRUE(contains(msg, ".jsonl")) << msg;
    EXPECT_TRUE(contains(msg, "Parquet, CSV and Arrow files are not read")) << msg;
  }
  // dataset_val too, with its own key.
  Config c = Config::from_string(
      "dataset_val: {_component_: torchtune.datasets.samsum_dataset, split: test}\n", "t.yaml");
  EXPECT_TRUE(contains(builders_error(c), "dataset_val.source=/path/to/local/copy.json"))
      << builders_error(c);
}

TEST(HubDatasets, AHubNameAsSourceIsNamedToo) {
  const std::string msg = builders_error(
      dataset_config("  _component_: torchtune.datasets.text_completion_dataset\n"
                     "  source: trl-internal-testing/sentiment-trl-style\n  column: prompt\n"));
  EXPECT_TRUE(contains(msg,
                       "dataset.source 'trl-internal-testing/sentiment-trl-style' is the Hugging "
                       "Face Hub dataset"))
      << msg;
  EXPECT_TRUE(fusetune::looks_like_hub_dataset("yahma/alpaca-cleaned"));
  EXPECT_FALSE(fusetune::looks_like_hub_dataset("data/train.jsonl"));
  EXPECT_FALSE(fusetune::looks_like_hub_dataset("/abs/path"));
  EXPECT_FALSE(fusetune::looks_like_hub_dataset("a/b/c"));
  EXPECT_FALSE(fusetune::looks_like_hub_dataset("plain.json"));
  // The loader-name form reads local files.
  EXPECT_EQ(builders_error(dataset_config("  _component_: torchtune.datasets.alpaca_dataset\n"
                                          "  source: json\n  data_files: my.json\n")),
            "");
  // Generic builders without source are left to the schema ("missing required key").
  EXPECT_EQ(builders_error(dataset_config("  _component_: torchtune.datasets.chat_dataset\n")), "");
}

TEST(HubDatasets, LocalSourceGetsTheBuildersColumnsAndOptions) {
  Config c = dataset_config(
      "  _component_: torchtune.datasets.samsum_dataset\n"
      "  source: s.jsonl\n");
  fusetune::apply_dataset_builders(c);
  EXPECT_EQ(c.str("dataset._component_"), "instruct");
  EXPECT_EQ(c.str("dataset.column_map.input"), "dialogue");
  EXPECT_EQ(c.str("dataset.column_map.output"), "summary");

  c = dataset_config("  _component_: torchtune.datasets.slimorca_dataset\n  source: o.json\n");
  fusetune::apply_dataset_builders(c);
  EXPECT_EQ(c.str("dataset._component_"), "chat");
  EXPECT_EQ(c.str("dataset.conversation_style"), "sharegpt");
  EXPECT_EQ(c.str("dataset.conversation_column"), "conversations");

  c = dataset_config("  _component_: torchtune.datasets.wikitext_dataset\n  source: w.jsonl\n");
  fusetune::apply_dataset_builders(c);
  EXPECT_EQ(c.str("dataset._component_"), "text_completion");
  EXPECT_EQ(c.str("dataset.column"), "page");

  // The config's own column_map replaces the builder's, as in torchtune.
  c = dataset_config(
      "  _component_: torchtune.datasets.samsum_dataset\n  source: s.jsonl\n"
      "  column_map: {input: chat, output: gist}\n");
  fusetune::apply_dataset_builders(c);
  EXPECT_EQ(c.str("dataset.column_map.input"), "chat");
  EXPECT_EQ(c.str("dataset.column_map.output"), "gist");
}

// A torchtune config whose dataset is a Hub builder, pointed at a local copy, validates and
// builds the rows the builder reads.
TEST(HubDatasets, LocalCopiesBuildAsTorchtuneReadsThem) {
  fusetune::testing::TempDir dir;
  const auto samsum = dir / "samsum.jsonl";
  std::ofstream(samsum) << R"({"id": "1", "dialogue": "Amy: hi Bob", "summary": "Amy greets Bob"})"
                        << "\n";
  const auto stack = dir / "se.jsonl";
  std::ofstream(stack)
      << R"({"question": "Why?", "response_j": "Because it is", "response_k": "No idea"})"
      << "\n";
  const auto orca = dir / "orca.json";
  std::ofstream(orca) << R"([{"conversations": [{"from": "system", "value": "Be brief"},)"
                      << R"( {"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4"}]}])";

  fusetune::testing::FakeTokenizer tok;
  fusetune::ModelConfig model;
  model.model_type = "llama";
  auto full = [](const std::string& dataset) {
    return Config::from_string(
        "output_dir: /tmp/o\nmodel: {init: random, vocab_size: 259, hidden_size: 8, "
        "intermediate_size: 16, num_hidden_layers: 1, num_attention_heads: 2}\ntokenizer: "
        "{_component_: byte}\n"
        "optimizer: {_component_: torch.optim.AdamW, lr: 1e-4}\n" +
            dataset,
        "t.yaml");
  };

  Config c =
      full("dataset: {_component_: torchtune.datasets.samsum_dataset, source: " + samsum.string() +
           "}\n");
  fusetune::apply_dataset_builders(c);
  std::vector<std::string> warnings;
  EXPECT_NO_THROW(fusetune::validate(c, fusetune::full_finetune_schema(), &warnings));
  auto ds = fusetune::build_dataset_from_config(
      fusetune::with_defaults(c, fusetune::full_finetune_schema()), tok, model);
  ASSERT_EQ(ds->size(), 1);
  const std::string text = tok.decode(ds->get(0).tokens, false);
  EXPECT_TRUE(contains(text, "Amy: hi Bob")) << text;
  EXPECT_TRUE(contains(text, "Amy greets Bob")) << text;

  c = full("dataset: {_component_: torchtune.datasets.slimorca_dataset, source: " + orca.string() +
           "}\n");
  fusetune::apply_dataset_builders(c);
  EXPECT_NO_THROW(fusetune::validate(c, fusetune::full_finetune_schema(), &warnings));
  ds = fusetune::build_dataset_from_config(
      fusetune::with_defaults(c, fusetune::full_finetune_schema()), tok, model);
  ASSERT_EQ(ds->size(), 1);
  EXPECT_TRUE(contains(tok.decode(ds->get(0).tokens, false), "2+2?"));

  c = full("dataset: {_component_: torchtune.datasets.stack_exchange_paired_dataset, source: " +
           stack.string() + "}\n");
  fusetune::apply_dataset_builders(c);
  EXPECT_EQ(c.str("dataset._component_"), "preference");
  auto pairs = fusetune::build_preference_dataset_from_config(c, tok, model);
  ASSERT_EQ(pairs->size(), 1);
  const std::string chosen = tok.decode(pairs->get(0).chosen.tokens, false);
  const std::string rejected = tok.decode(pairs->get(0).rejected.tokens, false);
  EXPECT_TRUE(contains(chosen, "Why?") && contains(chosen, "Because it is")) << chosen;
  EXPECT_TRUE(contains(rejected, "No idea")) << rejected;
}

}  // namespace
