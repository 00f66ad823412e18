// The full fine-tune recipe end to end through the `fusetune` binary, on the demo (a tiny
// random Llama, byte tokenizer, configs/demo/demo_corpus.txt): it learns, it is deterministic,
// the compile modes agree, and gradient accumulation normalizes the loss over the whole step.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "recipe_runs.h"
#include "test_support.h"

namespace fs = std::filesystem;
using fusetune::testing::CliRun;
using fusetune::testing::demo_command;
using fusetune::testing::logged_steps;
using fusetune::testing::LoggedStep;
using fusetune::testing::losses_of;
using fusetune::testing::Overrides;
using fusetune::testing::printed_steps;
using fusetune::testing::run_shell;
using fusetune::testing::TempDir;

namespace {

// Runs the small demo into `dir`/out and returns its logged steps (failing the test on error).
std::vector<LoggedStep> demo_steps(const TempDir& tmp, const std::string& name,
                                   const Overrides& extra, CliRun* run = nullptr) {
  const fs::path out = tmp / name;
  CliRun r = run_shell(demo_command(out, extra), tmp / (name + "_io"));
  EXPECT_EQ(r.code, 0) << r.err;
  if (run) *run = r;
  return logged_steps(out);
}

double rel_diff(double a, double b) { return std::abs(a - b) / std::max(std::abs(a), std::abs(b)); }

}  // namespace

TEST(RecipeTraining, DemoLossGoesDown) {
  TempDir tmp;
  CliRun r;
  auto steps = demo_steps(tmp, "run", {{"max_steps_per_epoch", "12"}}, &r);
  ASSERT_EQ(steps.size(), 12u) << r.out;
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i].step, int64_t(i) + 1);
    EXPECT_EQ(steps[i].epoch, 1);
    EXPECT_TRUE(std::isfinite(steps[i].loss));
    EXPECT_GT(steps[i].grad_norm, 0.0);  // clip_grad_norm is set: the norm is logged
  }
  // The printed step lines carry the same losses (4 decimals).
  auto printed = printed_steps(r.out);
  ASSERT_EQ(printed.size(), steps.size()) << r.out;
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(printed[i].first, steps[i].step);
    EXPECT_NEAR(printed[i].second, steps[i].loss, 0.6e-4);
  }
  // A random init predicts about uniformly over the 259 byte-tokenizer ids...
  EXPECT_NEAR(steps.front().loss, std::log(259.0), 0.3);
  // ...and a dozen steps on English text already cut the loss well down.
  const double last3 = (steps[9].loss + steps[10].loss + steps[11].loss) / 3;
  EXPECT_LT(last3, steps.front().loss - 1.0)
      << "first " << steps.front().loss << ", last three " << last3;
  // Warmup then cosine decay: the logged learning rate rises, then falls.
  EXPECT_LT(steps[0].lr, steps[4].lr);
  EXPECT_GT(steps[5].lr, steps[11].lr);
  // One epoch, one checkpoint, and it is resumable.
  EXPECT_TRUE(fs::exists(tmp / "run" / "epoch_0" / "model.safetensors"));
  EXPECT_TRUE(fs::exists(tmp / "run" / "epoch_0" / "recipe_state.json"));
}

// Same seed, same thread count: the same losses to the last bit, eager and compiled. Two
// threads, so that a reduction whose order depends on thread timing would show.
TEST(RecipeTraining, RerunIsBitwiseIdentical) {
  TempDir tmp;
  for (const std::string mode : {"false", "true"}) {
    const Overrides o = {{"compile", mode}, {"num_threads", "2"}};
    auto a = demo_steps(tmp, "a_" + mode, o);
    auto b = demo_steps(tmp, "b_" + mode, o);
    ASSERT_EQ(a.size(), 6u);
    ASSERT_EQ(b.size(), 6u);
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].loss, b[i].loss) << "compile=" << mode << " step " << a[i].step;
      EXPECT_EQ(a[i].grad_norm, b[i].grad_norm) << "compile=" << mode << " step " << a[i].step;
    }
    // And the saved weights are the same bytes.
    EXPECT_EQ(fusetune::testing::read_text(tmp / ("a_" + mode) / "epoch_0" / "model.safetensors"),
              fusetune::testing::read_text(tmp / ("b_" + mode) / "epoch_0" / "model.safetensors"))
        << "compile=" << mode;
  }
}

// The compiler's rewrites (fusion, memory planning) change rounding only.
TEST(RecipeTraining, CompileModesAgree) {
  TempDir tmp;
  auto eager = demo_steps(tmp, "false", {{"compile", "false"}});
  auto model = demo_steps(tmp, "model", {{"compile", "model"}});
  auto full = demo_steps(tmp, "true", {{"compile", "true"}});
  ASSERT_EQ(eager.size(), 6u);
  ASSERT_EQ(model.size(), 6u);
  ASSERT_EQ(full.size(), 6u);
  for (size_t i = 0; i < eager.size(); ++i) {
    EXPECT_LT(rel_diff(eager[i].loss, model[i].loss), 1e-5)
        << "step " << i + 1 << ": " << eager[i].loss << " vs compile=model " << model[i].loss;
    EXPECT_LT(rel_diff(eager[i].loss, full[i].loss), 1e-5)
        << "step " << i + 1 << ": " << eager[i].loss << " vs compile=true " << full[i].loss;
    EXPECT_LT(rel_diff(eager[i].grad_norm, full[i].grad_norm), 1e-4) << "step " << i + 1;
  }
}

// Two micro-batches of 2 are one batch of 4: the loss is normalized by the valid tokens of the
// whole optimizer step, not averaged per micro-batch. Unpacked rows of 1 to 4 sentences (18 to 419
// bytes) make the micro-batches' token counts differ, so a per-micro-batch mean would not match.
TEST(RecipeTraining, GradientAccumulationEqualsLargerBatch) {
  TempDir tmp;
  const std::string corpus =
      fusetune::testing::read_text(fs::path(::fusetune::testing::source_dir()) / "configs/demo/demo_corpus.txt");
  std::vector<std::string> sentences;
  for (size_t pos = 0; sentences.size() < 40;) {
    const size_t end = corpus.find(". ", pos);
    ASSERT_NE(end, std::string::npos);
    std::string sentence = corpus.substr(pos, end + 1 - pos);
    for (char& c : sentence)
      if (c == '\n') c = ' ';
    sentences.push_back(sentence);
    pos = end + 2;
  }
  std::string rows;
  for (size_t i = 0, next = 0; i < 16; ++i) {
    std::string text;
    for (size_t k = 0; k <= i % 4 && next < sentences.size(); ++k) text += sentences[next++] + " ";
    rows += nlohmann::json({{"text", text}}).dump() + "\n";
  }
  fusetune::testing::write_text(tmp / "rows.jsonl", rows);
  const Overrides common = {{"dataset.source", (tmp / "rows.jsonl").string()},
                            {"dataset.column", "text"},
                            {"dataset.packed", "false"},
                            {"tokenizer.max_seq_len", "512"},
                            {"max_steps_per_epoch", "4"}};
  Overrides big = common, accum = common;
  big["batch_size"] = "4";
  accum["batch_size"] = "2";
  accum["gradient_accumulation_steps"] = "2";
  CliRun r;
  auto a = demo_steps(tmp, "big", big, &r);
  ASSERT_EQ(a.size(), 4u);
  ASSERT_NE(r.out.find("16 examples"), std::string::npos) << r.out;
  ASSERT_EQ(r.out.find("truncated"), std::string::npos) << r.out;
  // Eager, and compiled (where the step's outputs must not alias buffers the next micro-batch
  // reuses: the first micro-batch's gradients are still being accumulated into).
  for (const std::string mode : {"false", "true"}) {
    accum["compile"] = mode;
    auto b = demo_steps(tmp, "accum_" + mode, accum);
    ASSERT_EQ(b.size(), 4u);
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_LT(rel_diff(a[i].loss, b[i].loss), 1e-5)
          << "compile=" << mode << " step " << i + 1 << ": " << a[i].loss << " vs " << b[i].loss;
      EXPECT_LT(rel_diff(a[i].grad_norm, b[i].grad_norm), 1e-4)
          << "compile=" << mode << " step " << i + 1;
    }
  }
}
