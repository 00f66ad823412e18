// Command-line overrides: key=value, ~key, torchtune's component shorthand, and their errors.
#include <gtest/gtest.h>

#include "checks.h"
#include "fusetune/config/config.h"
#include "fusetune/util/error.h"

using fusetune::Config;
using fusetune::Error;
using fusetune::testing::error_of;

namespace {

Config base() {
  return Config::from_string(R"(output_dir: /tmp/a
batch_size: 2
optimizer:
  _component_: AdamW
  lr: 2e-5
model:
  lora_attn_modules: [q_proj]
profiler:
  enabled: false
)",
                             "configs/base.yaml");
}

}  // namespace

TEST(ConfigOverrides, SetsExistingAndNewDottedKeys) {
  Config c = base();
  c.apply_overrides({"optimizer.lr=1e-4", "batch_size=8", "optimizer.weight_decay=0.1",
                     "metric_logger.log_dir=/tmp/logs", "+seed=3"});
  EXPECT_DOUBLE_EQ(c.f64("optimizer.lr"), 1e-4);
  EXPECT_EQ(c.i64("batch_size"), 8);
  EXPECT_DOUBLE_EQ(c.f64("optimizer.weight_decay"), 0.1);
  EXPECT_EQ(c.str("metric_logger.log_dir"), "/tmp/logs");  // maps created on the way
  EXPECT_EQ(c.i64("seed"), 3);
  EXPECT_EQ(c.str("optimizer._component_"), "AdamW");  // siblings untouched
}

TEST(ConfigOverrides, ValuesAreYaml) {
  Config c = base();
  c.apply_overrides(
      {"model.lora_attn_modules=[q_proj,v_proj]", "dataset={_component_: alpaca, source: a.json}",
       "dataset.template=Question: {x}", "output_dir=", "batch_size=null", "name=a=b"});
  EXPECT_EQ(c.str_list("model.lora_attn_modules"), (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(c.str("dataset._component_"), "alpaca");
  EXPECT_EQ(c.str("dataset.source"), "a.json");
  EXPECT_EQ(c.str("dataset.template"), "Question: {x}");  // not a map: text with ": "
  EXPECT_TRUE(c.has("output_dir"));
  EXPECT_EQ(c.str("output_dir"), "");
  EXPECT_FALSE(c.has("batch_size"));  // null = absent
  EXPECT_EQ(c.str("name"), "a=b");    // split at the first '='
}

TEST(ConfigOverrides, TildeDeletes) {
  Config c = base();
  c.apply_overrides({"~profiler", "~optimizer.lr"});
  EXPECT_FALSE(c.has("profiler"));
  EXPECT_FALSE(c.has("optimizer.lr"));
  EXPECT_TRUE(c.has("optimizer._component_"));
  EXPECT_EQ(c.keys(), (std::vector<std::string>{"output_dir", "batch_size", "optimizer", "model"}));
}

TEST(ConfigOverrides, DeletingAMissingKeyIsAnErrorWithSuggestion) {
  Config c = base();
  EXPECT_EQ(error_of([&] { c.apply_overrides({"~optimizer.lrr"}); }),
            "cannot delete 'optimizer.lrr': no such key (did you mean 'optimizer.lr'?) "
            "(configs/base.yaml)");
  EXPECT_NE(error_of([&] { c.apply_overrides({"~profiler=1"}); }).find("takes no value"),
            std::string::npos);
}

TEST(ConfigOverrides, ComponentShorthandAsInTorchtune) {
  Config c = base();
  c.apply_overrides({"optimizer=torch.optim.SGD"});
  EXPECT_EQ(c.str("optimizer._component_"), "torch.optim.SGD");
  EXPECT_DOUBLE_EQ(c.f64("optimizer.lr"), 2e-5);  // the rest of the map stays
}

TEST(ConfigOverrides, MalformedOverridesAreNamed) {
  Config c = base();
  EXPECT_EQ(error_of([&] { c.apply_overrides({"optimizer.lr"}); }),
            "override 'optimizer.lr' is not key=value (e.g. optimizer.lr=1e-4, or ~key to delete)");
  EXPECT_NE(error_of([&] { c.apply_overrides({"=3"}); }).find("override '=3'"), std::string::npos);
  EXPECT_NE(error_of([&] { c.apply_overrides({"a..b=3"}); }).find("is not a config key"),
            std::string::npos);
  EXPECT_NE(error_of([&] { c.apply_overrides({"a b=3"}); }).find("is not a config key"),
            std::string::npos);
  std::string msg = error_of([&] { c.apply_overrides({"model.lora_attn_modules=[q_proj,"}); });
  EXPECT_NE(msg.find("override 'model.lora_attn_modules=[q_proj,'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not valid YAML"), std::string::npos) << msg;
  msg = error_of([&] { c.apply_overrides({"batch_size.x=1"}); });
  EXPECT_NE(msg.find("override 'batch_size.x=1'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'batch_size' is '2', not a map"), std::string::npos) << msg;
}

TEST(ConfigOverrides, ErrorsNameTheOverrideThatSetAValue) {
  Config c = base();
  c.apply_overrides({"optimizer.lr=fast"});
  std::string msg = error_of([&] { c.f64("optimizer.lr"); });
  EXPECT_EQ(
      msg, "config key 'optimizer.lr' must be a number, got 'fast' (override 'optimizer.lr=fast')");
  c.apply_overrides({"optimizer={lr: slow}"});
  EXPECT_EQ(c.where("optimizer.lr"), "override 'optimizer={lr: slow}'");
  EXPECT_EQ(c.where("batch_size"), "configs/base.yaml:2");
}

TEST(ConfigOverrides, AppliedInOrder) {
  Config c = base();
  c.apply_overrides({"batch_size=4", "batch_size=16", "~batch_size", "batch_size=1"});
  EXPECT_EQ(c.i64("batch_size"), 1);
}
