// A reward model from a real pretrained causal LM (docs/reward_models.md): the built-in config
// stories260K/reward_model_single_device, stories260K loaded as a classifier with a fresh score
// head, trained on preference pairs made from TinyStories: a story's next sentence (chosen)
// against the same words in reverse order (rejected). On held-out pairs (other stories) the
// classifier starts near chance and ends well above it; fixed seed, one thread.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fusetune/cli/command.h"
#include "fusetune/config/builtin_configs.h"
#include "fusetune/config/config.h"
#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/recipes/recipe_setup.h"
#include "fusetune/recipes/reward_step.h"
#include "fusetune/recipes/training_step.h"
#include "fusetune/runtime/eager_executor.h"
#include "fusetune/util/fs.h"
#include "fusetune/util/strings.h"
#include "metrics_log.h"
#include "test_support.h"

using namespace fusetune;
using namespace fusetune::testing;
namespace fs = std::filesystem;

namespace {

// Up to `n` pairs from the stories' paragraphs: prompt the first sentence, chosen the second,
// rejected the second's words reversed.
void write_story_pairs(const fs::path& stories, const fs::path& out, int n) {
  std::ifstream in(stories);
  nlohmann::json rows = nlohmann::json::array();
  std::string line;
  while (int(rows.size()) < n && std::getline(in, line)) {
    const std::vector<std::string> sentences = split(line, '.');
    if (sentences.size() < 3) continue;
    const std::string prompt = trim(sentences[0]) + ".", chosen = trim(sentences[1]) + ".";
    std::vector<std::string> words;
    for (const std::string& w : split(trim(sentences[1]), ' '))
      if (!w.empty()) words.push_back(w);
    if (words.size() < 4 || chosen.size() > 120) continue;
    std::string rejected;
    for (auto it = words.rbegin(); it != words.rend(); ++it)
      rejected += (rejected.empty() ? "" : " ") + *it;
    rows.push_back({{"prompt", prompt}, {"chosen", chosen}, {"rejected", rejected + "."}});
  }
  write_file_atomic(out, rows.dump());
}

// The built-in config with the assets' paths, these pairs and a short schedule.
Config reward_config(const fs::path& assets, const fs::path& pairs, const fs::path& out,
                     const std::string& split) {
  Config c = load_config("stories260K/reward_model_single_device");
  c.apply_overrides({"output_dir=" + out.string(),
                     "tokenizer.path=" + (assets / "stories260K/tokenizer.json").string(),
                     "checkpointer.checkpoint_dir=" + (assets / "stories260K").string(),
                     "dataset.source=" + pairs.string(), "dataset.split=" + split, "~dataset_val",
                     "max_steps_per_epoch=40", "epochs=1", "batch_size=8", "optimizer.lr=3e-3",
                     "num_threads=1", "log_peak_memory_stats=false"});
  return c;
}

// The share of `cfg`'s pairs whose chosen answer scores above the rejected one.
double pair_accuracy(const Config& cfg, const ModelConfig& model, const TensorMap& params) {
  auto tok = build_tokenizer(cfg);
  auto pairs = build_preference_dataset_from_config(cfg, *tok, model);
  LoaderOptions lo = loader_options_from(cfg, *tok);
  lo.shuffle = false;
  lo.drop_last = false;
  DataLoader loader(*pairs, lo);
  double correct = 0, n = 0;
  for (int64_t s = 0; s < loader.steps_per_epoch(); ++s) {
    Batch b = loader.next();
    TensorMap in = batch_inputs(b);
    in["last_token_mask"] = last_token_mask(b);
    Graph g = build_sequence_scores_graph(model, b.batch_size, b.seq_len, DType::F32);
    const Tensor r = EagerExecutor(g).run(in, params)[0];
    const int64_t B = b.batch_size / 2;
    for (int64_t i = 0; i < B; ++i) correct += r.data<float>()[i] > r.data<float>()[B + i];
    n += double(B);
  }
  return correct / n;
}

}  // namespace

TEST(Stories260KReward, HeldOutAccuracyRisesWellAboveChance) {
  FT_REQUIRE_ASSET("stories260K/model.safetensors");
  FT_REQUIRE_ASSET("datasets/tinystories_197k.txt");
  const fs::path assets = assets_dir();
  TempDir tmp;
  const fs::path pairs = tmp / "pairs.json", out = tmp / "run";
  write_story_pairs(assets / "datasets/tinystories_197k.txt", pairs, 400);
  Config train = reward_config(assets, pairs, out, "train[:320]");
  write_file_atomic(tmp / "train.yaml", train.to_yaml());
  ASSERT_EQ(cli::cmd_run(
                {"reward_model_finetune_single_device", "--config", (tmp / "train.yaml").string()}),
            0);
  const std::vector<double> acc = logged_values(out, "accuracy");
  ASSERT_EQ(acc.size(), 40u);

  // Held-out: the base model with the recipe's fresh score head (lr 0 keeps it), then trained.
  Config held = reward_config(assets, pairs, tmp / "held", "train[320:]");
  held.resolve();
  const fs::path base_out = tmp / "base";
  Config base = reward_config(assets, pairs, base_out, "train[:8]");
  base.apply_overrides({"optimizer.lr=0", "max_steps_per_epoch=1"});
  write_file_atomic(tmp / "base.yaml", base.to_yaml());
  ASSERT_EQ(cli::cmd_run(
                {"reward_model_finetune_single_device", "--config", (tmp / "base.yaml").string()}),
            0);
  HFCheckpoint before = load_hf_checkpoint(base_out / "epoch_0");
  HFCheckpoint after = load_hf_checkpoint(out / "epoch_0");
  ASSERT_EQ(after.config.num_labels, 1);
  const TensorMap p0(before.tensors.begin(), before.tensors.end());
  const TensorMap p1(after.tensors.begin(), after.tensors.end());
  const double a0 = pair_accuracy(held, before.config, p0);
  const double a1 = pair_accuracy(held, after.config, p1);
  double late = 0;
  for (size_t i = acc.size() - 10; i < acc.size(); ++i) late += acc[i] / 10.0;
  std::printf(
      "stories260K reward model: held-out accuracy %.3f -> %.3f; trained batches' last "
      "10 steps %.3f\n",
      a0, a1, late);
  EXPECT_GT(a1, 0.8);
  EXPECT_GT(a1, a0 + 0.2);
}
