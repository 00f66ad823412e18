// The full fine-tune on a real pretrained model: Karpathy's stories260K (HF layout, HF
// tokenizer.json) on TinyStories text and on Alpaca records. The recipe's logged losses are
// checked against the model evaluated in-process (eager forward, loss in double), before
// training and from the saved epoch_0 directory.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "fusetune/config/config.h"
#include "fusetune/data/loader.h"
#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/recipes/recipe_setup.h"
#include "fusetune/recipes/registry.h"
#include "fusetune/runtime/eager_executor.h"
#include "recipe_runs.h"
#include "test_support.h"

namespace fs = std::filesystem;
using fusetune::testing::CliRun;
using fusetune::testing::logged_steps;
using fusetune::testing::LoggedStep;
using fusetune::testing::run_shell;
using fusetune::testing::TempDir;
using fusetune::testing::write_text;

namespace {

// A config for stories260K with every path absolute; `dataset` is the dataset section.
std::string stories_config(const fs::path& out, const std::string& dataset, int64_t steps_per_epoch,
                           int64_t epochs) {
  const fs::path a = fusetune::testing::assets_dir();
  return "output_dir: " + out.string() +
         "\n"
         "model:\n  init: checkpoint\n"
         "checkpointer:\n  checkpoint_dir: " +
         (a / "stories260K").string() +
         "\n"
         "tokenizer:\n  _component_: hf\n  path: " +
         (a / "stories260K" / "tokenizer.json").string() + "\n  max_seq_len: 128\n" + dataset +
         "seed: 3\nshuffle: true\n"
         "batch_size: 4\n"
         "epochs: " +
         std::to_string(epochs) + "\nmax_steps_per_epoch: " + std::to_string(steps_per_epoch) +
         "\n"
         "optimizer:\n  _component_: AdamW\n  lr: 2e-3\n  weight_decay: 0.0\n"
         "lr_scheduler:\n  _component_: cosine_with_warmup\n  num_warmup_steps: 2\n"
         "loss:\n  _component_: cross_entropy\n"
         "clip_grad_norm: 1.0\n"
         "compile: true\n"
         "num_threads: 1\n"
         "log_every_n_steps: 1\n"
         "log_peak_memory_stats: false\n";
}

// The data the recipe sees, built in-process from the same config.
struct Data {
  std::unique_ptr<fusetune::Tokenizer> tokenizer;
  std::unique_ptr<fusetune::Dataset> dataset;
  std::unique_ptr<fusetune::DataLoader> loader;
};

Data data_of(const fusetune::Config& cfg, const fusetune::ModelConfig& model) {
  Data d;
  d.tokenizer = fusetune::build_tokenizer(cfg);
  d.dataset = fusetune::build_dataset_from_config(cfg, *d.tokenizer, model);
  d.loader = std::make_unique<fusetune::DataLoader>(
      *d.dataset, fusetune::loader_options_from(cfg, *d.tokenizer));
  return d;
}

fusetune::Batch batch_at(Data& d, int64_t epoch, int64_t index) {
  d.loader->set_state({epoch, index});
  return d.loader->next();
}

fusetune::Tensor ids(const std::vector<int32_t>& v, int64_t B, int64_t T) {
  fusetune::Tensor t = fusetune::Tensor::empty({B, T}, fusetune::DType::I32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

// Mean cross-entropy over the batch's valid labels: eager logits, log-softmax in double.
double eager_loss(const fusetune::HFCheckpoint& ck, const fusetune::Batch& b) {
  EXPECT_TRUE(b.doc_ids.empty()) << "eager_loss handles unpacked batches only";
  fusetune::Graph g =
      fusetune::build_logits_graph(ck.config, b.batch_size, b.seq_len, fusetune::DType::F32);
  fusetune::EagerExecutor ex(g);
  fusetune::TensorMap inputs, params;
  inputs["tokens"] = ids(b.tokens, b.batch_size, b.seq_len);
  inputs["positions"] = ids(b.positions, b.batch_size, b.seq_len);
  for (const auto& [name, t] : ck.tensors) params[name] = t;
  std::vector<fusetune::Tensor> out = ex.run(inputs, params);
  const int64_t V = ck.config.vocab_size;
  const float* logits = out[0].data<float>();
  double sum = 0;
  int64_t n = 0;
  for (size_t i = 0; i < b.labels.size(); ++i) {
    if (b.labels[i] == fusetune::kIgnoreIndex) continue;
    const float* row = logits + int64_t(i) * V;
    double mx = row[0];
    for (int64_t v = 1; v < V; ++v) mx = std::max(mx, double(row[v]));
    double z = 0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(double(row[v]) - mx);
    sum += mx + std::log(z) - double(row[b.labels[i]]);
    ++n;
  }
  return sum / double(n);
}

double rel_diff(double a, double b) { return std::abs(a - b) / std::max(std::abs(a), std::abs(b)); }

struct Trained {
  std::vector<LoggedStep> steps;
  fusetune::Config cfg;
};

Trained train(const TempDir& tmp, const std::string& dataset, int64_t steps_per_epoch,
              int64_t epochs) {
  const fs::path yaml = tmp / "config.yaml";
  write_text(yaml, stories_config(tmp / "out", dataset, steps_per_epoch, epochs));
  CliRun r = run_shell(
      fusetune::testing::run_command("full_finetune_single_device", yaml.string(), {}), tmp / "io");
  EXPECT_EQ(r.code, 0) << r.err;
  // The config exactly as the recipe receives it: resolved, schema defaults filled in (alpaca's
  // train_on_input defaults to true there, as in torchtune).
  fusetune::Config cfg = fusetune::Config::from_file(yaml.string());
  cfg.resolve();
  return {
      logged_steps(tmp / "out"),
      fusetune::with_defaults(cfg, *fusetune::find_recipe("full_finetune_single_device").schema)};
}

}  // namespace

TEST(RecipeStories260K, TinyStoriesTextCompletion) {
  FT_REQUIRE_ASSET("stories260K/model.safetensors");
  FT_REQUIRE_ASSET("datasets/tinystories_197k.txt");
  TempDir tmp;
  const std::string dataset =
      "dataset:\n  _component_: text_completion\n  source: " +
      (fusetune::testing::assets_dir() / "datasets" / "tinystories_197k.txt").string() +
      "\n  packed: false\n";
  const int64_t kSteps = 10;
  Trained t = train(tmp, dataset, kSteps, 1);
  ASSERT_EQ(int64_t(t.steps.size()), kSteps);

  const fusetune::HFCheckpoint before =
      fusetune::load_hf_checkpoint(fusetune::testing::assets_dir() / "stories260K");
  const fusetune::HFCheckpoint after = fusetune::load_hf_checkpoint(tmp / "out" / "epoch_0");
  Data d = data_of(t.cfg, before.config);
  // Step 1's logged loss is the pretrained model's loss on the first batch.
  const fusetune::Batch first = batch_at(d, 0, 0);
  const double l0 = eager_loss(before, first);
  EXPECT_LT(rel_diff(t.steps[0].loss, l0), 1e-5)
      << "logged " << t.steps[0].loss << ", eager " << l0;
  // Training lowered the loss on what it trained on (the first four batches)...
  double sum_before = 0, sum_after = 0;
  for (int64_t i = 0; i < 4; ++i) {
    const fusetune::Batch b = batch_at(d, 0, i);
    sum_before += eager_loss(before, b);
    sum_after += eager_loss(after, b);
  }
  EXPECT_LT(sum_after, sum_before * 0.95)
      << "mean loss before " << sum_before / 4 << ", after " << sum_after / 4;
  // ...and on stories it has not seen (the batches after the last trained one).
  double unseen_before = 0, unseen_after = 0;
  for (int64_t i = kSteps; i < kSteps + 4; ++i) {
    const fusetune::Batch b = batch_at(d, 0, i);
    unseen_before += eager_loss(before, b);
    unseen_after += eager_loss(after, b);
  }
  EXPECT_LT(unseen_after, unseen_before)
      << "held-out loss before " << unseen_before / 4 << ", after " << unseen_after / 4;
  std::printf(
      "stories260K text: step 1 logged %.5f eager %.5f; trained batches %.4f -> %.4f; held-out "
      "%.4f -> %.4f\n",
      t.steps[0].loss, l0, sum_before / 4, sum_after / 4, unseen_before / 4, unseen_after / 4);
  // The saved directory is usable as a model directory: the tokenizer files came along.
  EXPECT_TRUE(fs::exists(tmp / "out" / "epoch_0" / "tokenizer.json"));
}

TEST(RecipeStories260K, AlpacaSavedWeightsAreTheTrainedOnes) {
  FT_REQUIRE_ASSET("stories260K/model.safetensors");
  FT_REQUIRE_ASSET("datasets/alpaca_tiny.json");
  TempDir tmp;
  const std::string dataset =
      "dataset:\n  _component_: alpaca\n  source: " +
      (fusetune::testing::assets_dir() / "datasets" / "alpaca_tiny.json").string() +
      "\n  packed: false\n";
  const int64_t kSteps = 5;
  Trained t = train(tmp, dataset, kSteps, 2);
  ASSERT_EQ(int64_t(t.steps.size()), 2 * kSteps);
  // Instructions are far from TinyStories: the second epoch's batches (reshuffled) already
  // cost less on average than the first epoch's.
  double e1 = 0, e2 = 0;
  for (int64_t i = 0; i < kSteps; ++i) {
    e1 += t.steps[size_t(i)].loss;
    e2 += t.steps[size_t(kSteps + i)].loss;
  }
  EXPECT_LT(e2, e1) << "epoch means " << e1 / kSteps << " -> " << e2 / kSteps;

  // Step kSteps+1's logged loss is the in-memory model after epoch 0 on epoch 1's first batch;
  // the saved epoch_0 directory, loaded and evaluated eagerly, must give the same loss.
  const fusetune::HFCheckpoint saved = fusetune::load_hf_checkpoint(tmp / "out" / "epoch_0");
  Data d = data_of(t.cfg, saved.config);
  const double l = eager_loss(saved, batch_at(d, 1, 0));
  EXPECT_LT(rel_diff(t.steps[size_t(kSteps)].loss, l), 1e-5)
      << "logged at step " << kSteps + 1 << ": " << t.steps[size_t(kSteps)].loss
      << ", saved epoch_0 gives " << l;
  std::printf(
      "stories260K alpaca: epoch means %.4f -> %.4f; step %d logged %.7f, saved epoch_0 eager "
      "%.7f\n",
      e1 / kSteps, e2 / kSteps, int(kSteps + 1), t.steps[size_t(kSteps)].loss, l);
  // And the pretrained weights give something else (the check can tell the two apart).
  const fusetune::HFCheckpoint before =
      fusetune::load_hf_checkpoint(fusetune::testing::assets_dir() / "stories260K");
  EXPECT_GT(rel_diff(eager_loss(before, batch_at(d, 1, 0)), l), 1e-3);
}
