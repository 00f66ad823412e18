// Row-sparse embedding gradients in whole runs: the same run with row sets (the default) and with
// FUSETUNE_SPARSE_EMBEDDING_GRAD=0 (every gradient dense, as before them) logs bitwise the same
// losses and gradient norms and saves bitwise the same weights, in every compile mode, with a
// tied embedding (whose gradient the head makes dense), with micro-batches (the union of their
// rows) and over 2 ranks (the union over ranks, packed for the all-reduce). A vocabulary of 8192
// x 64 makes the gradient 2 MiB, so each step's backward reuses the last step's buffer and clears
// only the rows it held; the byte tokenizer touches at most 259 of its rows.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "metrics_log.h"
#include "mpi_runs.h"
#include "recipe_runs.h"
#include "test_support.h"

using namespace fusetune::testing;
namespace fs = std::filesystem;

namespace {

const std::string kDenseEmbeddingGrad = "FUSETUNE_SPARSE_EMBEDDING_GRAD=0";

struct SparseRunResult {
  std::vector<LoggedStep> steps;
  std::string weights;
};

SparseRunResult sparse_run_result(const fs::path& out) {
  return {logged_steps(out), read_text(out / "epoch_0" / "model.safetensors")};
}

void expect_same_run_bitwise(const SparseRunResult& sparse, const SparseRunResult& dense,
                             size_t steps) {
  ASSERT_EQ(sparse.steps.size(), steps);
  ASSERT_EQ(dense.steps.size(), steps);
  for (size_t i = 0; i < steps; ++i) {
    EXPECT_EQ(sparse.steps[i].loss, dense.steps[i].loss) << "step " << i + 1;
    EXPECT_EQ(sparse.steps[i].grad_norm, dense.steps[i].grad_norm) << "step " << i + 1;
    EXPECT_GT(sparse.steps[i].grad_norm, 0.0);
  }
  EXPECT_FALSE(sparse.weights.empty());
  EXPECT_TRUE(sparse.weights == dense.weights) << "the saved weights differ";
}

}  // namespace

TEST(SparseEmbeddingGradRuns, BitwiseTheDenseRunInEveryCompileModeTiedOrNot) {
  const TempDir tmp;
  struct Case {
    std::string compile;
    bool tied;
  };
  for (const Case& c : {Case{"false", false}, Case{"model", false}, Case{"true", false},
                        Case{"false", true}, Case{"true", true}}) {
    const std::string name = "compile_" + c.compile + (c.tied ? "_tied" : "");
    SCOPED_TRACE(name);
    SparseRunResult results[2];
    for (int dense = 0; dense < 2; ++dense) {
      const fs::path out = tmp.path() / (name + (dense ? "_dense" : "_sparse"));
      const Overrides o = {{"compile", c.compile},
                           {"model.vocab_size", "8192"},
                           {"model.tie_word_embeddings", c.tied ? "true" : "false"},
                           {"gradient_accumulation_steps", "2"},
                           {"max_steps_per_epoch", "4"},
                           {"optimizer.weight_decay", "0.01"}};
      const std::string cmd = (dense ? kDenseEmbeddingGrad + " " : "") + demo_command(out, o);
      const CliRun r = run_shell(cmd, out.string() + "_s");
      ASSERT_EQ(r.code, 0) << r.out << r.err;
      results[dense] = sparse_run_result(out);
    }
    expect_same_run_bitwise(results[0], results[1], 4);
  }
}

TEST(SparseEmbeddingGradRuns, ABadSwitchValueIsAnError) {
  const TempDir tmp;
  const CliRun r = run_shell("FUSETUNE_SPARSE_EMBEDDING_GRAD=yes " +
                                 demo_command(tmp.path() / "out", {{"max_steps_per_epoch", "1"}}),
                             tmp.path() / "s");
  EXPECT_NE(r.code, 0);
  EXPECT_NE((r.out + r.err).find("FUSETUNE_SPARSE_EMBEDDING_GRAD must be 0"), std::string::npos)
      << r.out << r.err;
}

// 2 ranks read different rows of the corpus, so their row sets differ: the union is summed
// packed, bitwise the dense all-reduce (same additions per element), with 2 micro-batches.
TEST(DistTraining, SparseEmbeddingGradientsSumOverRanksBitwiseTheDenseAllReduce) {
  FT_REQUIRE_MPIRUN();
  const TempDir tmp;
  const fs::path corpus = write_uneven_corpus(tmp.path());
  const Overrides extra = {{"gradient_accumulation_steps", "2"},
                           {"model.vocab_size", "8192"},
                           {"save_every_n_steps", "100"}};
  SparseRunResult results[2];
  for (int dense = 0; dense < 2; ++dense) {
    const fs::path out = tmp.path() / std::to_string(dense);
    const Overrides o = rank_run_overrides(out, corpus, 2, 4, extra);
    const CliRun r = run_shell(mpirun_command(2, "full_finetune_distributed", "demo/tiny_full", o,
                                              dense ? "-x " + kDenseEmbeddingGrad : std::string()),
                               tmp.path() / ("s" + std::to_string(dense)));
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    results[dense] = sparse_run_result(out);
  }
  expect_same_run_bitwise(results[0], results[1], 4);
}
