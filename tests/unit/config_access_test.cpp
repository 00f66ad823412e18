// Config: parsing, typed access by dotted key, and the messages of its errors.
#include <gtest/gtest.h>

#include <fstream>

#include "checks.h"
#include "fusetune/config/config.h"
#include "fusetune/util/error.h"
#include "test_support.h"

using fusetune::Config;
using fusetune::Error;
using fusetune::testing::error_of;

namespace {

const char* kYaml = R"(output_dir: /tmp/out
seed: 7
shuffle: False
optimizer:
  _component_: AdamW
  lr: abc
  betas: [0.9, 0.95]
  eps: 1e-8
max_steps_per_epoch: null
clip_grad_norm: ~
files: [a.safetensors, b.safetensors]
shard: 5GB
nested: {a: {b: 3}}
)";

}  // namespace

TEST(ConfigAccess, TypedValuesByDottedKey) {
  Config c = Config::from_string(kYaml, "configs/x.yaml");
  EXPECT_EQ(c.str("output_dir"), "/tmp/out");
  EXPECT_EQ(c.i64("seed"), 7);
  EXPECT_DOUBLE_EQ(c.f64("seed"), 7.0);  // an integer is a number too
  EXPECT_FALSE(c.boolean("shuffle"));
  EXPECT_DOUBLE_EQ(c.f64("optimizer.eps"), 1e-8);  // 1e-8 is a float (YAML 1.1 would say str)
  EXPECT_EQ(c.f64_list("optimizer.betas"), (std::vector<double>{0.9, 0.95}));
  EXPECT_EQ(c.str_list("files"), (std::vector<std::string>{"a.safetensors", "b.safetensors"}));
  EXPECT_EQ(c.bytes("shard"), 5000000000LL);
  EXPECT_EQ(c.i64("nested.a.b"), 3);
  EXPECT_EQ(c.str("seed"), "7");  // a scalar read as text is its text
}

TEST(ConfigAccess, NullCountsAsAbsent) {
  Config c = Config::from_string(kYaml, "x.yaml");
  EXPECT_FALSE(c.has("max_steps_per_epoch"));
  EXPECT_FALSE(c.has("clip_grad_norm"));
  EXPECT_FALSE(c.has("nope"));
  EXPECT_FALSE(c.has("nested.a.zz"));
  EXPECT_TRUE(c.has("nested.a.b"));
  EXPECT_EQ(c.opt_i64("max_steps_per_epoch"), std::nullopt);
  EXPECT_EQ(c.i64("max_steps_per_epoch", 5), 5);
  EXPECT_DOUBLE_EQ(c.f64("clip_grad_norm", 1.5), 1.5);
  EXPECT_EQ(c.str("nope", "d"), "d");
  EXPECT_TRUE(c.boolean("nope", true));
  EXPECT_EQ(c.str_list("nope", {"x"}), (std::vector<std::string>{"x"}));
  EXPECT_EQ(c.bytes("nope", 10), 10);
}

TEST(ConfigAccess, WrongTypeNamesKeyTypeValueAndFileLine) {
  Config c = Config::from_string(kYaml, "configs/x.yaml");
  EXPECT_EQ(error_of([&] { c.f64("optimizer.lr"); }),
            "config key 'optimizer.lr' must be a number, got 'abc' (configs/x.yaml:6)");
  // A default does not hide a present value of the wrong type.
  EXPECT_NE(error_of([&] { c.f64("optimizer.lr", 1.0); }), "");
  EXPECT_EQ(error_of([&] { c.i64("optimizer.eps"); }),
            "config key 'optimizer.eps' must be an integer, got '1e-8' (configs/x.yaml:8)");
  EXPECT_NE(error_of([&] { c.boolean("seed"); }).find("must be true or false, got '7'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { c.str("optimizer"); }).find("must be a string, got a map"),
            std::string::npos);
  EXPECT_NE(error_of([&] { c.str_list("seed"); }).find("'seed' must be a list, got '7'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { c.bytes("output_dir"); }).find("must be a byte size"),
            std::string::npos);
  EXPECT_NE(error_of([&] { c.sub("seed"); }).find("must be a map"), std::string::npos);
}

TEST(ConfigAccess, MissingRequiredKeyNamesKeyAndFile) {
  Config c = Config::from_string(kYaml, "configs/x.yaml");
  EXPECT_EQ(error_of([&] { c.str("tokenizer.path"); }),
            "config key 'tokenizer.path' (a string) is required but missing (configs/x.yaml)");
  EXPECT_NE(error_of([&] { c.i64("max_steps_per_epoch"); }).find("required but missing"),
            std::string::npos);
}

TEST(ConfigAccess, SubViewKeepsFullKeysInMessages) {
  Config c = Config::from_string(kYaml, "configs/x.yaml");
  Config opt = c.sub("optimizer");
  EXPECT_EQ(opt.keys(), (std::vector<std::string>{"_component_", "lr", "betas", "eps"}));
  EXPECT_EQ(opt.str("_component_"), "AdamW");
  EXPECT_EQ(opt.full_key("lr"), "optimizer.lr");
  EXPECT_EQ(error_of([&] { opt.f64("lr"); }),
            "config key 'optimizer.lr' must be a number, got 'abc' (configs/x.yaml:6)");
  EXPECT_EQ(c.sub("nested").sub("a").i64("b"), 3);
  EXPECT_TRUE(c.is_map("nested"));
  EXPECT_TRUE(c.is_list("files"));
  EXPECT_FALSE(c.is_list("nested"));
}

TEST(ConfigAccess, ParseErrorsNameFileAndLine) {
  std::string msg = error_of([] { Config::from_string("a: 1\nb: [1, 2\nc: 3\n", "my.yaml"); });
  EXPECT_NE(msg.find("my.yaml:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("invalid YAML"), std::string::npos) << msg;
  msg = error_of([] { Config::from_string("a: 1\n  b: 2\n", "my.yaml"); });
  EXPECT_EQ(msg.rfind("my.yaml:2:", 0), 0u) << msg;
}

TEST(ConfigAccess, DuplicateKeysAreAnError) {
  std::string msg =
      error_of([] { Config::from_string("optimizer:\n  lr: 1\n  lr: 2\n", "dup.yaml"); });
  EXPECT_EQ(msg, "dup.yaml:3: duplicate key 'optimizer.lr' (first at line 2)");
}

TEST(ConfigAccess, TopLevelMustBeAMap) {
  EXPECT_NE(error_of([] {
              Config::from_string("- a\n- b\n", "l.yaml");
            }).find("l.yaml: a config must be a YAML map"),
            std::string::npos);
  EXPECT_NE(error_of([] { Config::from_string("just text", "s.yaml"); }).find("must be a YAML map"),
            std::string::npos);
  Config empty = Config::from_string("", "e.yaml");  // an empty file is an empty map
  EXPECT_TRUE(empty.keys().empty());
  Config comments = Config::from_string("# only a comment\n", "e.yaml");
  EXPECT_TRUE(comments.keys().empty());
}

TEST(ConfigAccess, FromFileReadsAndNamesMissingFile) {
  fusetune::testing::TempDir dir;
  std::string path = (dir / "c.yaml").string();
  std::ofstream(path) << "output_dir: /x\nlr: oops\n";
  Config c = Config::from_file(path);
  EXPECT_EQ(c.str("output_dir"), "/x");
  EXPECT_EQ(c.source(), path);
  EXPECT_EQ(error_of([&] { c.f64("lr"); }),
            "config key 'lr' must be a number, got 'oops' (" + path + ":2)");
  std::string msg = error_of([&] { Config::from_file((dir / "nope.yaml").string()); });
  EXPECT_NE(msg.find("cannot open config file"), std::string::npos);
  EXPECT_NE(msg.find("nope.yaml"), std::string::npos);
  msg = error_of([&] { Config::from_file(dir.path().string()); });
  EXPECT_NE(msg.find("is a directory"), std::string::npos) << msg;
}

TEST(ConfigAccess, CopiesAreIndependent) {
  Config a = Config::from_string("x: 1\nm: {y: 2}\n", "a.yaml");
  Config view = a.sub("m");
  Config b = a;
  b.apply_overrides({"x=5", "m.y=6"});
  EXPECT_EQ(a.i64("x"), 1);
  EXPECT_EQ(a.i64("m.y"), 2);
  EXPECT_EQ(view.i64("y"), 2);
  EXPECT_EQ(b.i64("x"), 5);
  EXPECT_EQ(b.i64("m.y"), 6);
}

TEST(ConfigAccess, AnchorsAreCopiedSoOverridesChangeOnePlace) {
  Config c = Config::from_string("base: &b {lr: 1}\nother: *b\n", "a.yaml");
  c.apply_overrides({"other.lr=2"});
  EXPECT_EQ(c.i64("base.lr"), 1);
  EXPECT_EQ(c.i64("other.lr"), 2);
}

TEST(ConfigAccess, RecursiveAliasIsAnErrorNotAHang) {
  std::string msg = error_of([] { Config::from_string("a: &x [1, *x]\n", "r.yaml"); });
  EXPECT_NE(msg.find("recursive YAML alias"), std::string::npos) << msg;
}

TEST(ConfigAccess, ToYamlRoundTrips) {
  Config c = Config::from_string(kYaml, "x.yaml");
  Config again = Config::from_string(c.to_yaml(), "again.yaml");
  EXPECT_EQ(again.keys(), c.keys());
  EXPECT_EQ(again.str("optimizer.lr"), "abc");
  EXPECT_EQ(again.f64_list("optimizer.betas"), c.f64_list("optimizer.betas"));
  EXPECT_FALSE(again.has("max_steps_per_epoch"));
  Config sub = Config::from_string(c.sub("nested").to_yaml(), "sub.yaml");
  EXPECT_EQ(sub.i64("a.b"), 3);
}
