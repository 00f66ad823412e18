// The fusetune binary: help, ls, cp, validate, run's validation, and errors with suggestions.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "checks.h"
#include "cli_runner.h"
#include "files.h"
#include "fusetune/config/builtin_configs.h"
#include "test_support.h"

namespace fs = std::filesystem;

namespace {

using Result = ::fusetune::testing::CliResult;
using fusetune::testing::contains;
using fusetune::testing::read_text;

// Runs the built fusetune binary with `args` (shell words) in `cwd` (default: the current
// directory).
Result fusetune_cli(const std::string& args, const std::string& cwd = "") {
  return ::fusetune::testing::run_fusetune(args, cwd.empty() ? "." : cwd);
}

}  // namespace

TEST(CliCommands, HelpListsCommands) {
  Result r = fusetune_cli("--help");
  EXPECT_EQ(r.code, 0);
  for (const char* c : {"run", "ls", "cp", "validate"}) EXPECT_TRUE(contains(r.out, c)) << r.out;
  r = fusetune_cli("");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "usage: fusetune <command>"));
  r = fusetune_cli("run --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(contains(r.out, "usage: fusetune run RECIPE --config CONFIG")) << r.out;
  r = fusetune_cli("help cp");
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(contains(r.out, "usage: fusetune cp CONFIG DEST")) << r.out;
}

TEST(CliCommands, UnknownCommandSuggests) {
  Result r = fusetune_cli("valdate x");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(
      contains(r.out, "fusetune: error: unknown command 'valdate' (did you mean 'validate'?)"))
      << r.out;
  r = fusetune_cli("ls --verbos");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "unknown option '--verbos' (did you mean '--verbose'?)")) << r.out;
}

TEST(CliCommands, LsShowsRecipesAndConfigs) {
  Result r = fusetune_cli("ls");
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(contains(r.out, "RECIPE")) << r.out;
  EXPECT_TRUE(contains(r.out, "full_finetune_single_device")) << r.out;
  EXPECT_TRUE(contains(r.out, "lora_finetune_single_device")) << r.out;
  for (const auto& b : fusetune::builtin_configs()) EXPECT_TRUE(contains(r.out, b.name)) << b.name;
}

TEST(CliCommands, CpCopiesAndRefusesToOverwrite) {
  fusetune::testing::TempDir dir;
  std::string expected(fusetune::find_builtin_config("llama3_2/1B_full_single_device")->text);
  fs::path dest = dir / "my.yaml";
  Result r = fusetune_cli("cp llama3_2/1B_full_single_device " + dest.string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "Copied file to " + dest.string())) << r.out;
  EXPECT_EQ(read_text(dest), expected);

  std::ofstream(dest) << "mine\n";
  r = fusetune_cli("cp llama3_2/1B_full_single_device " + dest.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "already exists; pass --force to overwrite it")) << r.out;
  EXPECT_EQ(read_text(dest), "mine\n");
  r = fusetune_cli("cp llama3_2/1B_full_single_device " + dest.string() + " --force");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(read_text(dest), expected);

  // Into a directory, without an extension, into a missing directory.
  r = fusetune_cli("cp demo/tiny_full " + dir.path().string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(dir / "tiny_full.yaml"));
  r = fusetune_cli("cp demo/tiny_full " + (dir / "noext").string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(dir / "noext.yaml"));
  r = fusetune_cli("cp demo/tiny_full " + (dir / "a/b/c.yaml").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "--make-parents")) << r.out;
  r = fusetune_cli("cp demo/tiny_full " + (dir / "a/b/c.yaml").string() + " --make-parents");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(dir / "a/b/c.yaml"));

  r = fusetune_cli("cp demo/tiny_ful " + (dir / "x.yaml").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(
      contains(r.out, "no built-in config 'demo/tiny_ful' (did you mean 'demo/tiny_full'?)"))
      << r.out;
  EXPECT_FALSE(fs::exists(dir / "x.yaml"));
  r = fusetune_cli("cp demo/tiny_full");
  EXPECT_EQ(r.code, 1);
}

TEST(CliCommands, CopiedConfigRunsTheSameFromAnyDirectory) {
  fusetune::testing::TempDir dir;
  ASSERT_EQ(fusetune_cli("cp stories260K/full_single_device s.yaml", dir.path().string()).code, 0);
  Result r = fusetune_cli("validate s.yaml", dir.path().string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "Config is well-formed!")) << r.out;
}

TEST(CliCommands, ValidateBuiltinsAndFiles) {
  for (const auto& b : fusetune::builtin_configs()) {
    Result r = fusetune_cli("validate " + b.name);
    EXPECT_EQ(r.code, 0) << b.name << ": " << r.out;
    EXPECT_EQ(r.out, "recipe " + b.recipe +
                         " (from the config's `# recipe:` line)\nConfig is well-formed!\n")
        << b.name;
  }
  fusetune::testing::TempDir dir;
  fs::path bad = dir / "bad.yaml";
  std::ofstream(bad) << "# recipe: full_finetune_single_device\n"
                        "output_dir: /tmp/o\n"
                        "optimzer: {lr: 1}\n"
                        "optimizer: {_component_: torch.optim.AdamW, lrr: 1e-4}\n"
                        "compile: sometimes\n"
                        "model: {init: random, config: /c.json}\n"
                        "tokenizer: {_component_: byte}\n"
                        "dataset: {_component_: text_completion, source: t.txt}\n";
  Result r = fusetune_cli("validate " + bad.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "4 problems")) << r.out;
  EXPECT_TRUE(contains(
      r.out, "unknown config key 'optimzer' (did you mean 'optimizer'?) (" + bad.string() + ":3)"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "unknown config key 'optimizer.lrr' (did you mean 'optimizer.lr'?)"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "missing required config key 'optimizer.lr'")) << r.out;
  EXPECT_TRUE(contains(r.out, "'compile' must be one of false, true, model, model+loss")) << r.out;
  EXPECT_FALSE(contains(r.out, "well-formed")) << r.out;
  // Overrides fix it.
  r = fusetune_cli("validate " + bad.string() +
                   " '~optimzer' 'optimizer={_component_: SGD, lr: 0.1}' compile=model+loss");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "Config is well-formed!")) << r.out;
  // The lora schema rejects it (no lora_attn_modules).
  r = fusetune_cli("validate " + bad.string() +
                   " --recipe lora_finetune_single_device '~optimzer' optimizer.lr=1 "
                   "'~optimizer.lrr' compile=true");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "model.lora_attn_modules")) << r.out;
  r = fusetune_cli("validate " + bad.string() + " --recipe lora_finetune");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "unknown recipe 'lora_finetune'")) << r.out;
  r = fusetune_cli("validate nope.yaml");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "neither a file nor a built-in config")) << r.out;
}

TEST(CliCommands, ValidateReportsYamlSyntaxWithLine) {
  fusetune::testing::TempDir dir;
  fs::path bad = dir / "syntax.yaml";
  std::ofstream(bad) << "output_dir: /o\noptimizer: [1, 2\nseed: 1\n";
  Result r = fusetune_cli("validate " + bad.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, bad.string() + ":")) << r.out;
  EXPECT_TRUE(contains(r.out, "invalid YAML")) << r.out;
}

TEST(CliCommands, RunValidatesBeforeTheRecipe) {
  Result r = fusetune_cli("run full_finetune_single_device --config demo/tiny_full optimzer.lr=1");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out,
                       "unknown config key 'optimzer' (did you mean 'optimizer'?) "
                       "(override 'optimzer.lr=1')"))
      << r.out;
  r = fusetune_cli("run full_finetune_single_device --config demo/tiny_full batch_size=abc");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(
      contains(r.out, "'batch_size' must be an integer, got 'abc' (override 'batch_size=abc')"))
      << r.out;
  r = fusetune_cli("run full_finetune_single_devic --config demo/tiny_full");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "did you mean 'full_finetune_single_device'?")) << r.out;
  r = fusetune_cli("run full_finetune_single_device");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "missing --config")) << r.out;
  r = fusetune_cli("run --config demo/tiny_full");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "missing RECIPE")) << r.out;
  r = fusetune_cli("run full_finetune_single_device --config demo/tiny_full optimizer.lr");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "unexpected argument 'optimizer.lr': overrides are key=value"))
      << r.out;
  r = fusetune_cli("run full_finetune_single_device --confg demo/tiny_full");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "did you mean '--config'?")) << r.out;
}
