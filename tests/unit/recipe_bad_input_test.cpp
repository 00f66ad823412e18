// The full fine-tune refuses bad input cleanly: one line on stderr naming what is wrong, a
// non-zero exit code, and nothing in output_dir that looks like a finished checkpoint.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "fusetune/io/hf_checkpoint.h"
#include "recipe_runs.h"
#include "test_support.h"

namespace fs = std::filesystem;
using fusetune::testing::CliRun;
using fusetune::testing::demo_command;
using fusetune::testing::Overrides;
using fusetune::testing::read_text;
using fusetune::testing::run_shell;
using fusetune::testing::TempDir;
using fusetune::testing::write_text;

namespace {

// A tiny Llama with the byte tokenizer's vocabulary, saved as an HF directory.
fusetune::ModelConfig tiny_byte_model() {
  fusetune::ModelConfig c;
  c.vocab_size = 259;
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 8;
  c.max_position_embeddings = 128;
  return c;
}

fs::path save_tiny_checkpoint(const fs::path& dir) {
  const fusetune::ModelConfig c = tiny_byte_model();
  fusetune::NamedTensors tensors;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 0.02f);
  for (const auto& [name, shape] : fusetune::expected_parameters(c)) {
    fusetune::Tensor t = fusetune::Tensor::empty(shape, fusetune::DType::F32);
    for (int64_t i = 0; i < t.numel(); ++i)
      t.data<float>()[i] = name.find("norm") != std::string::npos ? 1.f : normal(rng);
    tensors.push_back({name, t});
  }
  fusetune::save_hf_checkpoint(dir, c, tensors);
  return dir;
}

// The demo recipe, starting from the checkpoint in `ck`.
Overrides from_checkpoint(const fs::path& ck) {
  // The demo's inline architecture keys are for random init only: drop them.
  return {
      {"~model", ""}, {"model.init", "checkpoint"}, {"checkpointer.checkpoint_dir", ck.string()}};
}

struct Failure {
  CliRun run;
  fs::path output_dir;
};

Failure run_expecting_failure(const TempDir& tmp, const Overrides& o) {
  Failure f;
  f.output_dir = tmp / "out";
  f.run = run_shell(demo_command(f.output_dir, o), tmp / "io");
  return f;
}

// Exit code 1, `fusetune: error:` on stderr with every part of `parts`, no checkpoint
// directory that looks complete. One line, except for config validation, which lists every
// problem it found below a summary line ("N problems in the config...").
void expect_clean_failure(const Failure& f, std::initializer_list<std::string> parts,
                          int config_problems = 0) {
  const std::string& err = f.run.err;
  EXPECT_EQ(f.run.code, 1) << err;
  EXPECT_EQ(err.rfind("fusetune: error: ", 0), 0u) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1 + config_problems)
      << "unexpected lines on stderr:\n"
      << err;
  if (config_problems > 0) {
    EXPECT_NE(err.find("problem"), std::string::npos) << err;
  }
  for (const std::string& p : parts)
    EXPECT_NE(err.find(p), std::string::npos) << "missing '" << p << "' in: " << err;
  EXPECT_TRUE(fusetune::testing::complete_looking_checkpoints(f.output_dir).empty()) << err;
}

}  // namespace

TEST(RecipeBadInput, GoodTinyCheckpointTrains) {
  // The control for the corrupted variants below: the intact checkpoint trains.
  TempDir tmp;
  const fs::path ck = save_tiny_checkpoint(tmp / "ck");
  Overrides o = from_checkpoint(ck);
  o["max_steps_per_epoch"] = "2";
  CliRun r = run_shell(demo_command(tmp / "out", o), tmp / "io");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(tmp / "out" / "epoch_0" / "recipe_state.json"));
}

TEST(RecipeBadInput, TruncatedSafetensors) {
  TempDir tmp;
  const fs::path ck = save_tiny_checkpoint(tmp / "ck");
  const fs::path file = ck / "model.safetensors";
  fs::resize_file(file, fs::file_size(file) - 100);
  expect_clean_failure(run_expecting_failure(tmp, from_checkpoint(ck)), {"model.safetensors"});
}

TEST(RecipeBadInput, HeaderOffsetsPastTheEnd) {
  TempDir tmp;
  const fs::path ck = save_tiny_checkpoint(tmp / "ck");
  const fs::path file = ck / "model.safetensors";
  // Rewrite the header with one tensor's data placed 1 MiB past the end of the file.
  const std::string bytes = read_text(file);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(bytes[size_t(i)]);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  auto& offsets = header.at("model.norm.weight").at("data_offsets");
  offsets[0] = offsets[0].get<uint64_t>() + (uint64_t(1) << 20);
  offsets[1] = offsets[1].get<uint64_t>() + (uint64_t(1) << 20);
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char((uint64_t(h.size()) >> (8 * i)) & 0xff);
  write_text(file, out + h + bytes.substr(8 + n));
  expect_clean_failure(run_expecting_failure(tmp, from_checkpoint(ck)),
                       {"model.safetensors", "model.norm.weight"});
}

TEST(RecipeBadInput, TensorOfTheWrongShape) {
  TempDir tmp;
  const fs::path ck = save_tiny_checkpoint(tmp / "ck");
  // config.json now implies a wider MLP than the saved tensors have.
  nlohmann::json cj = nlohmann::json::parse(read_text(ck / "config.json"));
  cj["intermediate_size"] = 48;
  write_text(ck / "config.json", cj.dump(2));
  expect_clean_failure(run_expecting_failure(tmp, from_checkpoint(ck)), {"mlp", "shape"});
}

TEST(RecipeBadInput, MisspelledConfigKey) {
  TempDir tmp;
  expect_clean_failure(run_expecting_failure(tmp, {{"max_step_per_epoch", "3"}}),
                       {"max_step_per_epoch", "did you mean 'max_steps_per_epoch'"}, 1);
  TempDir tmp2;
  expect_clean_failure(run_expecting_failure(tmp2, {{"optimizer.weight_decy", "0.1"}}),
                       {"weight_decy", "did you mean", "weight_decay"}, 1);
}

TEST(RecipeBadInput, EmptyDatasetFile) {
  TempDir tmp;
  write_text(tmp / "empty.txt", "");
  expect_clean_failure(
      run_expecting_failure(tmp, {{"dataset.source", (tmp / "empty.txt").string()}}),
      {"empty.txt"});
}

TEST(RecipeBadInput, MalformedJsonlRow) {
  TempDir tmp;
  const fs::path data = tmp / "rows.jsonl";
  write_text(data,
             "{\"instruction\": \"Say hi\", \"input\": \"\", \"output\": \"hi\"}\n"
             "{\"instruction\": \"Say bye\", \"input\": \"\", \"output\": \"bye\"\n"
             "{\"instruction\": \"Count\", \"input\": \"\", \"output\": \"1 2 3\"}\n");
  expect_clean_failure(run_expecting_failure(tmp, {{"dataset._component_", "alpaca"},
                                                   {"dataset.source", data.string()},
                                                   {"dataset.packed", "false"}}),
                       {"rows.jsonl", "line 2"});
}

TEST(RecipeBadInput, ResumeWithNothingToResume) {
  TempDir tmp;
  Failure f = run_expecting_failure(tmp, {{"resume_from_checkpoint", "true"}});
  expect_clean_failure(f, {"resume_from_checkpoint", "no resumable checkpoint"});
}

TEST(RecipeBadInput, ResumeIgnoresIncompleteCheckpoint) {
  // A checkpoint directory whose save was cut short (no recipe_state.json) is no resume point.
  TempDir tmp;
  save_tiny_checkpoint(tmp / "out" / "epoch_0");
  Failure f = run_expecting_failure(tmp, {{"resume_from_checkpoint", "true"}});
  EXPECT_EQ(f.run.code, 1) << f.run.err;
  EXPECT_NE(f.run.err.find("no resumable checkpoint"), std::string::npos) << f.run.err;
}

// A checkpoint whose recipe state was damaged after it was written: resuming names the file,
// and the damaged checkpoint stays as it is (nothing overwritten).
TEST(RecipeBadInput, CorruptRecipeStateSafetensors) {
  TempDir tmp;
  CliRun first = run_shell(demo_command(tmp / "out", {{"max_steps_per_epoch", "2"}}), tmp / "io1");
  ASSERT_EQ(first.code, 0) << first.err;
  const fs::path st = tmp / "out" / "epoch_0" / "recipe_state.safetensors";
  std::string bytes = read_text(st);
  ASSERT_GT(bytes.size(), 64u);
  write_text(st, bytes.substr(0, bytes.size() / 2));  // truncated
  Failure f = run_expecting_failure(
      tmp, {{"resume_from_checkpoint", "true"}, {"max_steps_per_epoch", "2"}});
  EXPECT_EQ(f.run.code, 1) << f.run.err;
  EXPECT_NE(f.run.err.find("fusetune: error: " + st.string()), std::string::npos) << f.run.err;
  EXPECT_EQ(read_text(st), bytes.substr(0, bytes.size() / 2));
}

TEST(RecipeBadInput, CorruptRecipeStateJson) {
  TempDir tmp;
  CliRun first = run_shell(demo_command(tmp / "out", {{"max_steps_per_epoch", "2"}}), tmp / "io1");
  ASSERT_EQ(first.code, 0) << first.err;
  write_text(tmp / "out" / "epoch_0" / "recipe_state.json", "{\"format\": \"fusetune.recip");
  Failure f = run_expecting_failure(
      tmp, {{"resume_from_checkpoint", "true"}, {"max_steps_per_epoch", "2"}});
  EXPECT_EQ(f.run.code, 1) << f.run.err;
  EXPECT_NE(f.run.err.find(
                "no resumable checkpoint (damaged: " + (tmp / "out" / "epoch_0").string() + ": "),
            std::string::npos)
      << f.run.err;
  EXPECT_NE(f.run.err.find("recipe_state.json"), std::string::npos) << f.run.err;
}
