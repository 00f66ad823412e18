// Validation during training (torchtune's dataset_val, run_val_every_n_steps): the mean loss
// over every validation batch is logged as val_loss on its own line and in metrics.jsonl, with
// the weights of that step; without a cadence it runs at the end of each epoch. The value is
// checked against the loss of the saved checkpoint on the same data, computed here.
#include <gtest/gtest.h>

#include <sstream>

#include <nlohmann/json.hpp>

#include "fusetune/config/builtin_configs.h"
#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/recipes/recipe_setup.h"
#include "fusetune/recipes/training_step.h"
#include "fusetune/runtime/eager_executor.h"
#include "recipe_runs.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace fusetune;
using namespace fusetune::testing;

namespace {

const Overrides kVal = {
    {"dataset_val._component_", "text_completion"},
    {"dataset_val.source", std::string(source_dir()) + "/configs/demo/demo_corpus.txt"},
    {"dataset_val.split", "train[90%:]"},
    {"dataset_val.packed", "true"}};

}  // namespace

TEST(Validation, ValLossEveryNStepsIsTheCheckpointsLossOnTheValidationData) {
  TempDir tmp;
  Overrides o = kVal;
  o["run_val_every_n_steps"] = "2";
  CliRun run = run_shell(demo_command(tmp / "out", o), tmp / "io");
  ASSERT_EQ(run.code, 0) << run.err;
  const auto v = logged_step_values(tmp / "out", "val_loss");
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[0].first, 2);
  EXPECT_EQ(v[2].first, 6);
  EXPECT_NE(run.out.find("Step 6 | val_loss:"), std::string::npos) << run.out;
  EXPECT_EQ(logged_steps(tmp / "out").size(), 6u);  // the training lines are unchanged

  // The loss of the checkpoint saved after step 6 on the same validation batches.
  Config cfg = load_config("demo/tiny_full");
  std::vector<std::string> overrides;
  for (const auto& [k, val] : demo_overrides(tmp / "out", o)) overrides.push_back(k + "=" + val);
  cfg.apply_overrides(overrides);
  cfg.resolve();
  const ModelConfig model = model_architecture(cfg);
  HFCheckpoint ck = load_hf_checkpoint(tmp / "out" / "epoch_0");
  TensorMap params;
  for (auto& [n, t] : ck.tensors) params[n] = t;
  auto tok = build_tokenizer(cfg);
  auto ds = build_dataset_from_config(cfg, *tok, model, "dataset_val");
  LoaderOptions lo = loader_options_from(cfg, *tok);
  lo.shuffle = false;
  lo.drop_last = false;
  DataLoader loader(*ds, lo);
  double total = 0, tokens = 0;
  for (int64_t i = 0; i < loader.steps_per_epoch(); ++i) {
    const Batch b = loader.next();
    TrainingGraphOptions g;
    g.batch_size = b.batch_size;
    g.seq_len = b.seq_len;
    g.packed = !b.doc_ids.empty();
    g.trainable = [](const std::string&) { return false; };
    TensorMap in = batch_inputs(b);
    in["loss_scale"] = scalar_input(1.0, DType::F32);
    total += element_as_double(
        EagerExecutor(build_training_graph(model, g).graph).run(in, params)[0], 0);
    tokens += double(b.num_valid_labels());
  }
  EXPECT_NEAR(v[2].second, total / tokens, 1e-5 * (total / tokens));
}

TEST(Validation, WithoutACadenceItRunsAtTheEndOfEachEpoch) {
  TempDir tmp;
  Overrides o = kVal;
  o["epochs"] = "2";
  o["max_steps_per_epoch"] = "3";
  CliRun run = run_shell(demo_command(tmp / "out", o), tmp / "io");
  ASSERT_EQ(run.code, 0) << run.err;
  const auto v = logged_step_values(tmp / "out", "val_loss");
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].first, 3);
  EXPECT_EQ(v[1].first, 6);
}

TEST(Validation, ACadenceWithoutValidationDataIsAConfigError) {
  TempDir tmp;
  CliRun run = run_shell(demo_command(tmp / "out", {{"run_val_every_n_steps", "2"}}), tmp / "io");
  EXPECT_EQ(run.code, 1);
  EXPECT_NE(run.err.find("run_val_every_n_steps' needs dataset_val"), std::string::npos) << run.err;
}

// torchtune's batch_size_val (its configs set ${batch_size}): the validation batch size; the
// mean over every labelled token does not depend on it.
TEST(Validation, BatchSizeValChangesTheBatchingNotTheLoss) {
  TempDir tmp;
  Overrides o = kVal;
  o["max_steps_per_epoch"] = "2";
  CliRun run = run_shell(demo_command(tmp / "a", o), tmp / "io_a");
  ASSERT_EQ(run.code, 0) << run.err;
  o["batch_size_val"] = "1";
  run = run_shell(demo_command(tmp / "b", o), tmp / "io_b");
  ASSERT_EQ(run.code, 0) << run.err;
  const auto a = logged_step_values(tmp / "a", "val_loss"),
             b = logged_step_values(tmp / "b", "val_loss");
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_NEAR(b[0].second, a[0].second, 1e-6 * a[0].second);
  o["batch_size_val"] = "0";
  run = run_shell(demo_command(tmp / "c", o), tmp / "io_c");
  EXPECT_EQ(run.code, 1);
  EXPECT_NE(run.err.find("batch_size_val"), std::string::npos) << run.err;
}
