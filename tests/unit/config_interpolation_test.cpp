// ${...} interpolation: references, splicing, relative keys, environment, and its errors.
#include <gtest/gtest.h>

#include <cstdlib>

#include "checks.h"
#include "fusetune/config/config.h"
#include "fusetune/util/error.h"

using fusetune::Config;
using fusetune::Error;
using fusetune::testing::error_of;

namespace {

const char* kInterpolationYaml = R"(output_dir: /tmp/run
checkpointer:
  output_dir: ${output_dir}
  log: ${output_dir}/logs/${dataset.max_seq_len}.txt
  sibling: ${.output_dir}
  parent: ${..seed}
dataset:
  max_seq_len: 512
tokenizer:
  max_seq_len: ${dataset.max_seq_len}
seed: 3
modules: [q_proj, "${output_dir}"]
copy_of: ${dataset}
)";

}  // namespace

TEST(ConfigInterpolation, ResolvesAfterOverrides) {
  Config c = Config::from_string(kInterpolationYaml, "i.yaml");
  c.apply_overrides({"output_dir=/data/out", "dataset.max_seq_len=128"});
  c.resolve();
  EXPECT_TRUE(c.resolved());
  EXPECT_EQ(c.str("checkpointer.output_dir"), "/data/out");
  EXPECT_EQ(c.str("checkpointer.log"), "/data/out/logs/128.txt");
  EXPECT_EQ(c.i64("tokenizer.max_seq_len"), 128);  // a whole reference keeps its type
  EXPECT_EQ(c.str("checkpointer.sibling"), "/data/out");
  EXPECT_EQ(c.i64("checkpointer.parent"), 3);
  EXPECT_EQ(c.str_list("modules"), (std::vector<std::string>{"q_proj", "/data/out"}));
  EXPECT_EQ(c.i64("copy_of.max_seq_len"), 128);  // a map reference copies the map
  // The resolved text has no ${ left.
  EXPECT_EQ(c.to_yaml().find("${"), std::string::npos);
}

TEST(ConfigInterpolation, AccessorsResolveWithoutResolveCall) {
  Config c = Config::from_string(kInterpolationYaml, "i.yaml");
  EXPECT_FALSE(c.resolved());
  EXPECT_EQ(c.str("checkpointer.log"), "/tmp/run/logs/512.txt");
  EXPECT_EQ(c.i64("tokenizer.max_seq_len"), 512);
  EXPECT_EQ(c.sub("copy_of").i64("max_seq_len"), 512);
  EXPECT_EQ(c.sub("checkpointer").str("output_dir"), "/tmp/run");
}

TEST(ConfigInterpolation, UnknownReferenceNamesKeyAndSuggests) {
  Config c = Config::from_string("output_dir: /x\nlog_dir: ${outptu_dir}/logs\n", "u.yaml");
  std::string msg = error_of([&] { c.resolve(); });
  EXPECT_EQ(msg,
            "config key 'log_dir' refers to '${outptu_dir}', but 'outptu_dir' does not exist "
            "(did you mean 'output_dir'?) (u.yaml:2)");
  Config d =
      Config::from_string("dataset: {max_seq_len: 1}\nn: ${dataset.max_seq_lne}\n", "u.yaml");
  msg = error_of([&] { d.resolve(); });
  EXPECT_NE(msg.find("did you mean 'dataset.max_seq_len'?"), std::string::npos) << msg;
  // An override can remove the target of a reference.
  Config e = Config::from_string("output_dir: /x\nlog_dir: ${output_dir}\n", "u.yaml");
  e.apply_overrides({"~output_dir"});
  EXPECT_NE(error_of([&] { e.resolve(); }).find("'output_dir' does not exist"), std::string::npos);
}

TEST(ConfigInterpolation, CyclesAreErrors) {
  Config c = Config::from_string("a: ${b}\nb: x${c}\nc: ${a}\n", "c.yaml");
  std::string msg = error_of([&] { c.resolve(); });
  EXPECT_NE(msg.find("interpolation cycle: a -> b -> c -> a"), std::string::npos) << msg;
  Config self = Config::from_string("m:\n  x: ${m}\n", "c.yaml");
  EXPECT_NE(error_of([&] { self.resolve(); }).find("cycle"), std::string::npos);
}

TEST(ConfigInterpolation, EnvironmentVariables) {
  ::setenv("FUSETUNE_TEST_ENV_DIR", "/env/dir", 1);
  ::unsetenv("FUSETUNE_TEST_ENV_UNSET");
  Config c = Config::from_string(
      "a: ${oc.env:FUSETUNE_TEST_ENV_DIR}/x\n"
      "b: ${oc.env:FUSETUNE_TEST_ENV_UNSET,/default}\n"
      "c: ${oc.env:FUSETUNE_TEST_ENV_UNSET,null}\n",
      "e.yaml");
  c.resolve();
  EXPECT_EQ(c.str("a"), "/env/dir/x");
  EXPECT_EQ(c.str("b"), "/default");
  EXPECT_FALSE(c.has("c"));
  Config d = Config::from_string("a: ${oc.env:FUSETUNE_TEST_ENV_UNSET}\n", "e.yaml");
  EXPECT_NE(error_of([&] {
              d.resolve();
            }).find("environment variable FUSETUNE_TEST_ENV_UNSET, which is not set"),
            std::string::npos);
  Config e = Config::from_string("a: ${oc.decode:x}\n", "e.yaml");
  EXPECT_NE(error_of([&] { e.resolve(); }).find("supports only oc.env"), std::string::npos);
}

TEST(ConfigInterpolation, EscapesAndMalformedReferences) {
  Config c = Config::from_string("a: cost \\${x}\n", "m.yaml");
  c.resolve();
  EXPECT_EQ(c.str("a"), "cost ${x}");
  Config d = Config::from_string("a: ${b\nb: 1\n", "m.yaml");
  EXPECT_NE(error_of([&] { d.resolve(); }).find("unterminated"), std::string::npos);
  Config e = Config::from_string("a: x${m}\nm: {k: 1}\n", "m.yaml");
  EXPECT_NE(error_of([&] { e.resolve(); }).find("not a single value"), std::string::npos);
  Config f = Config::from_string("a: ${...b}\n", "m.yaml");
  EXPECT_NE(error_of([&] { f.resolve(); }).find("above the top"), std::string::npos);
}

TEST(ConfigInterpolation, DoublingReferencesAreBounded) {
  // Text that doubles at each level stops at 1 MiB...
  std::string yaml = "a0: " + std::string(64 * 1024, 'x') + "\n";
  for (int i = 1; i <= 8; ++i)
    yaml += "a" + std::to_string(i) + ": ${a" + std::to_string(i - 1) + "}${a" +
            std::to_string(i - 1) + "}\n";
  Config c = Config::from_string(yaml, "big.yaml");
  EXPECT_NE(error_of([&] { c.resolve(); }).find("more than 1 MiB"), std::string::npos);
  // ... and lists that double stop at 10000 values.
  std::string list = "b0: [";
  for (int i = 0; i < 100; ++i) list += "x, ";
  list += "x]\n";
  for (int i = 1; i <= 8; ++i)
    list += "b" + std::to_string(i) + ": [\"${b" + std::to_string(i - 1) + "}\", \"${b" +
            std::to_string(i - 1) + "}\"]\n";
  Config d = Config::from_string(list, "big.yaml");
  EXPECT_NE(error_of([&] { d.resolve(); }).find("more than 10000 values"), std::string::npos);
}
