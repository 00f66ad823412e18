// lora_reward_model_finetune_single_device (recipes/reward_recipes.h): LoRA adapters on a tiny
// causal LM's trunk and a fresh `score` head trained in full, on preference pairs written here
// (the byte tokenizer). It learns (the accuracy rises); its checkpoint's merged classifier is
// the base plus (alpha / r) B A on every adapted projection with the trained `score` (written
// out here in double precision from the PEFT adapter, which holds `score` as PEFT's SEQ_CLS
// task does); a resume from it continues bitwise, so adapters and score come back as they were
// in memory; PPO loads the merged classifier.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include <nlohmann/json.hpp>

#include "checks.h"
#include "fusetune/cli/command.h"
#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/io/safetensors.h"
#include "fusetune/recipes/recipe_setup.h"
#include "fusetune/util/fs.h"
#include "metrics_log.h"
#include "test_support.h"
#include "tiny_llama.h"
#include "token_reward_model.h"

using namespace fusetune;
using namespace fusetune::testing;
namespace fs = std::filesystem;

namespace {

// Pairs whose chosen answer is a kind word and rejected one an unkind word, four of each
// (their last letters overlap, so a random classifier ranks the pairs about at chance).
void write_lora_reward_pairs(const fs::path& p) {
  const char* kind[] = {" good", " nice", " kind", " great"};
  const char* unkind[] = {" bad", " mean", " rude", " awful"};
  nlohmann::json rows = nlohmann::json::array();
  for (int i = 0; i < 16; ++i)
    rows.push_back({{"prompt", "Answer " + std::to_string(i) + ":"},
                    {"chosen", kind[i % 4]},
                    {"rejected", unkind[(i + i / 4) % 4]}});
  write_file_atomic(p, rows.dump());
}

std::string lora_reward_yaml(const fs::path& base, const fs::path& pairs) {
  std::ostringstream s;
  s << "model:\n  init: checkpoint\n  lora_attn_modules: [q_proj, v_proj]\n"
    << "  apply_lora_to_mlp: true\n  lora_rank: 4\n  lora_alpha: 8\n"
    << "checkpointer:\n  checkpoint_dir: " << base.string() << "\n"
    << "tokenizer:\n  _component_: byte\n  max_seq_len: 48\n"
    << "dataset:\n  _component_: preference\n  source: " << pairs.string() << "\n"
    << "seed: 2\nshuffle: true\nbatch_size: 4\nepochs: 3\n"
    << "optimizer:\n  _component_: AdamW\n  lr: 1e-2\n  weight_decay: 0.0\n"
    << "compile: false\nnum_threads: 1\nlog_every_n_steps: 1\nlog_peak_memory_stats: false\n";
  return s.str();
}

int run_lora_reward(const fs::path& cfg, const fs::path& out,
                    const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {"lora_reward_model_finetune_single_device", "--config",
                                   cfg.string(), "output_dir=" + out.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  return cli::cmd_run(args);
}

}  // namespace

TEST(LoraRewardRecipe, LearnsAndSavesTheMergedClassifierAndTheScoreInTheAdapter) {
  TempDir tmp;
  const fs::path base = write_tiny_checkpoint(tmp.path());
  write_lora_reward_pairs(tmp / "pairs.json");
  write_file_atomic(tmp / "cfg.yaml", lora_reward_yaml(base, tmp / "pairs.json"));
  const fs::path out = tmp / "run";
  ASSERT_EQ(run_lora_reward(tmp / "cfg.yaml", out), 0);
  // It learns: 12 steps of 4 pairs; the accuracy of the last 3 beats the first 3's.
  const std::vector<double> acc = logged_values(out, "accuracy");

  ASSERT_EQ(acc.size(), 12u);
  EXPECT_GT(mean_of(acc, 9, 12), mean_of(acc, 0, 3) + 0.2);
  EXPECT_EQ(mean_of(acc, 9, 12), 1.0);
  // The adapter: PEFT's SEQ_CLS layout, `score` in modules_to_save.
  const fs::path ck = out / "epoch_2";
  const nlohmann::json ac = nlohmann::json::parse(read_file(ck / "adapter_config.json"));
  EXPECT_EQ(ac.at("task_type"), "SEQ_CLS");
  EXPECT_EQ(ac.at("modules_to_save"), nlohmann::json::array({"score"}));
  SafetensorsFile adapter = SafetensorsFile::open(ck / "adapter_model.safetensors");
  ASSERT_TRUE(adapter.has("base_model.model.score.weight"));
  // The merged classifier: score as trained, each adapted projection W + (alpha / r) B A.
  HFCheckpoint merged = load_hf_checkpoint(ck, {}, DType::F32);
  HFCheckpoint causal = load_hf_checkpoint(base, {}, DType::F32);
  EXPECT_EQ(merged.config.num_labels, 1);
  EXPECT_EQ(merged.tensors.count("lm_head.weight"), 0u);
  const Tensor score = adapter.tensor("base_model.model.score.weight").to(DType::F32);
  const Tensor& ms = merged.tensors.at("score.weight");
  ASSERT_EQ(ms.numel(), score.numel());
  for (int64_t i = 0; i < ms.numel(); ++i)
    EXPECT_EQ(ms.data<float>()[i], score.data<float>()[i]) << "score " << i;
  const std::string q = "model.layers.1.self_attn.q_proj";
  const Tensor A = adapter.tensor("base_model.model." + q + ".lora_A.weight").to(DType::F32);
  const Tensor B = adapter.tensor("base_model.model." + q + ".lora_B.weight").to(DType::F32);
  const Tensor& W0 = causal.tensors.at(q + ".weight");
  const Tensor& W = merged.tensors.at(q + ".weight");
  const int64_t out_dim = W.dim(0), in_dim = W.dim(1), r = A.dim(0);
  double moved = 0;
  for (int64_t o = 0; o < out_dim; ++o)
    for (int64_t i = 0; i < in_dim; ++i) {
      double ba = 0;
      for (int64_t k = 0; k < r; ++k)
        ba += double(B.data<float>()[o * r + k]) * double(A.data<float>()[k * in_dim + i]);
      const double want = double(W0.data<float>()[o * in_dim + i]) + 8.0 / 4.0 * ba;
      EXPECT_NEAR(W.data<float>()[o * in_dim + i], want, 1e-6) << q << " " << o << "," << i;
      moved = std::max(moved, std::abs(8.0 / 4.0 * ba));
    }
  EXPECT_GT(moved, 1e-4) << "the adapter trained";
  const std::string k = "model.layers.0.self_attn.k_proj.weight";  // not adapted
  for (int64_t i = 0; i < merged.tensors.at(k).numel(); ++i)
    ASSERT_EQ(merged.tensors.at(k).data<float>()[i], causal.tensors.at(k).data<float>()[i]);
}

// A resume from epoch_0 (its adapters and score from the PEFT adapter, the optimizer from
// recipe_state) gives the uninterrupted run's steps 5-12 bitwise.
TEST(LoraRewardRecipe, ResumesBitwiseFromItsAdapterAndScore) {
  TempDir tmp;
  const fs::path base = write_tiny_checkpoint(tmp.path());
  write_lora_reward_pairs(tmp / "pairs.json");
  write_file_atomic(tmp / "cfg.yaml", lora_reward_yaml(base, tmp / "pairs.json"));
  ASSERT_EQ(run_lora_reward(tmp / "cfg.yaml", tmp / "full"), 0);
  const fs::path resumed = tmp / "resumed";
  fs::create_directories(resumed);
  fs::copy(tmp / "full" / "epoch_0", resumed / "epoch_0", fs::copy_options::recursive);
  ASSERT_EQ(run_lora_reward(tmp / "cfg.yaml", resumed, {"resume_from_checkpoint=true"}), 0);
  const std::vector<double> all = logged_values(tmp / "full", "loss");
  const std::vector<double> rest = logged_values(resumed, "loss");
  ASSERT_EQ(all.size(), 12u);
  ASSERT_EQ(rest.size(), 8u);
  for (size_t i = 0; i < rest.size(); ++i) EXPECT_EQ(rest[i], all[4 + i]) << "step " << i + 5;
  // apply_lora_to_output has no head to adapt: refused by name.
  const std::string e = error_of(
      [&] { run_lora_reward(tmp / "cfg.yaml", tmp / "bad", {"model.apply_lora_to_output=true"}); });
  EXPECT_TRUE(contains(e, "model.apply_lora_to_output")) << e;
}

namespace {

// The LoRA run's PEFT adapter merged into the classifier m by hand: `score` as trained, and
// with `deltas` each adapted projection W + (alpha / r) B A in double.
void merge_adapter_by_hand(LoadedModel& m, const fs::path& adapter_dir, bool deltas) {
  const nlohmann::json ac = nlohmann::json::parse(read_file(adapter_dir / "adapter_config.json"));
  const double scale = ac.at("lora_alpha").get<double>() / ac.at("r").get<double>();
  SafetensorsFile adapter = SafetensorsFile::open(adapter_dir / "adapter_model.safetensors");
  const std::string prefix = "base_model.model.", a_suffix = ".lora_A.weight";
  m.params.at("score.weight") = adapter.tensor(prefix + "score.weight").to(DType::F32);
  for (const std::string& name : adapter.names()) {
    if (!deltas || name.size() < a_suffix.size() ||
        name.compare(name.size() - a_suffix.size(), a_suffix.size(), a_suffix) != 0)
      continue;
    const std::string module =
        name.substr(prefix.size(), name.size() - prefix.size() - a_suffix.size());
    const Tensor A = adapter.tensor(name).to(DType::F32);
    const Tensor B = adapter.tensor(prefix + module + ".lora_B.weight").to(DType::F32);
    Tensor& W = m.params.at(module + ".weight");
    const int64_t out_dim = W.dim(0), in_dim = W.dim(1), r = A.dim(0);
    for (int64_t o = 0; o < out_dim; ++o)
      for (int64_t i = 0; i < in_dim; ++i) {
        double ba = 0;
        for (int64_t k = 0; k < r; ++k)
          ba += double(B.data<float>()[o * r + k]) * double(A.data<float>()[k * in_dim + i]);
        float& w = W.data<float>()[o * in_dim + i];
        w = float(double(w) + scale * ba);
      }
  }
}

// The merged classifier written out here from the LoRA run's PEFT adapter and the causal base
// (each adapted projection W + (alpha / r) B A in double, `score` as trained); with `deltas`
// false, the base's projections unchanged (only the score head trained).
void write_merged_by_hand(const fs::path& base, const fs::path& adapter_dir, const fs::path& dir,
                          bool deltas) {
  write_classifier_checkpoint(
      base, dir, 1, 1, [&](LoadedModel& m) { merge_adapter_by_hand(m, adapter_dir, deltas); });
}

// One PPO step of the tiny policy against the value and reward models in `classifier`; returns
// the step's scores, value loss and loss.
std::vector<double> ppo_step_one_with(const fs::path& policy, const fs::path& classifier,
                                      const fs::path& tmp, const std::string& name) {
  std::string prompts;
  for (int i = 0; i < 4; ++i) prompts += "Answer " + std::to_string(i) + ":\n\n";
  write_file_atomic(tmp / "prompts.txt", prompts);
  std::ostringstream s;
  s << tiny_ppo_models_yaml(policy, classifier, classifier, true)
    << "dataset:\n  _component_: text_completion\n  source: " << (tmp / "prompts.txt").string()
    << "\n  add_eos: false\n"
    << "seed: 3\nshuffle: false\nbatch_size: 4\nnum_steps: 4\nppo_epochs: 1\nppo_batch_size: 4\n"
    << "gradient_accumulation_steps: 1\nforward_batch_size: 4\nmax_generated_tokens: 4\n"
    << "temperature: 1.0\nkl_coeff: 0.05\n"
    << "optimizer:\n  _component_: AdamW\n  lr: 1e-3\n  weight_decay: 0.0\n"
    << "compile: false\nnum_threads: 1\nlog_every_n_steps: 1\nlog_peak_memory_stats: false\n";
  const fs::path cfg = tmp / (name + ".yaml"), out = tmp / name;
  write_file_atomic(cfg, s.str());
  EXPECT_EQ(cli::cmd_run({"ppo_full_finetune_single_device", "--config", cfg.string(),
                          "output_dir=" + out.string()}),
            0);
  std::vector<double> step;
  for (const char* key : {"scores", "value_loss", "loss"}) {
    const std::vector<double> v = logged_values(out, key);
    step.push_back(v.empty() ? std::nan("") : v[0]);
  }
  return step;
}

}  // namespace

// PPO straight on the LoRA reward model's output directory (its merged classifier beside the
// PEFT adapter and recipe state) as value and reward model: the step-1 score, value loss and
// loss are those of a PPO run on the classifier merged here by hand from the adapter, and not
// those of the base with the trained score head alone (the LoRA deltas reach PPO's models).
TEST(LoraRewardRecipe, PpoLoadsTheMergedClassifierAsValueAndRewardModel) {
  TempDir tmp;
  const fs::path base = write_tiny_checkpoint(tmp.path());
  write_lora_reward_pairs(tmp / "pairs.json");
  write_file_atomic(tmp / "cfg.yaml", lora_reward_yaml(base, tmp / "pairs.json"));
  ASSERT_EQ(run_lora_reward(tmp / "cfg.yaml", tmp / "rm", {"epochs=1"}), 0);
  const fs::path trained = tmp / "rm" / "epoch_0";
  write_merged_by_hand(base, trained, tmp / "by_hand", true);
  write_merged_by_hand(base, trained, tmp / "score_only", false);
  const std::vector<double> lora = ppo_step_one_with(base, trained, tmp.path(), "ppo_lora");
  const std::vector<double> hand = ppo_step_one_with(base, tmp / "by_hand", tmp.path(), "ppo_hand");
  const std::vector<double> bare =
      ppo_step_one_with(base, tmp / "score_only", tmp.path(), "ppo_bare");
  for (size_t i = 0; i < 3; ++i)
    EXPECT_NEAR(lora[i], hand[i], 1e-5 * (1 + std::abs(hand[i]))) << "metric " << i;
  EXPECT_GT(std::abs(lora[0] - bare[0]), 1e-3) << "the adapters changed the score";
}
