// reward_model_finetune_single_device without assets: a tiny random classifier (or a causal LM
// checkpoint turned into one) with the byte tokenizer on preference pairs written here. The
// compile modes give the same losses, the first loss is about log 2 (scores near 0), the metrics
// TRL logs are there, and the checkpoint written is a Hugging Face
// LlamaForSequenceClassification that loads back.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include <nlohmann/json.hpp>

#include "checks.h"
#include "fusetune/cli/command.h"
#include "fusetune/compile/compiler.h"
#include "fusetune/config/builtin_configs.h"
#include "fusetune/config/recipe_schemas.h"
#include "fusetune/config/schema.h"
#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/recipes/recipe_setup.h"
#include "fusetune/recipes/reward_model_scorer.h"
#include "fusetune/recipes/step_plan.h"
#include "fusetune/rewards/reward_set.h"
#include "fusetune/runtime/eager_executor.h"
#include "fusetune/tokenizers/load_tokenizer.h"
#include "fusetune/util/fs.h"
#include "fusetune/util/strings.h"
#include "metrics_log.h"
#include "mpi_runs.h"
#include "recipe_runs.h"
#include "test_support.h"
#include "tiny_llama.h"

using namespace fusetune;
using namespace fusetune::testing;
namespace fs = std::filesystem;

namespace {

std::string reward_yaml(const fs::path& out, const fs::path& data) {
  std::ostringstream s;
  s << "output_dir: " << out.string() << "\n"
    << tiny_model_yaml(128) << "  num_labels: 1\n"
    << "tokenizer:\n  _component_: byte\n  max_seq_len: 64\n"
    << "dataset:\n  _component_: preference\n  source: " << data.string() << "\n"
    << "seed: 1\nshuffle: true\nbatch_size: 2\nepochs: 2\n"
    << "optimizer:\n  _component_: AdamW\n  lr: 1e-2\n  weight_decay: 0.0\n"
    << "compile: false\nnum_threads: 1\nlog_every_n_steps: 1\nlog_peak_memory_stats: false\n";
  return s.str();
}

void write_pairs(const fs::path& p, int n, bool margins = false) {
  nlohmann::json rows = nlohmann::json::array();
  for (int i = 0; i < n; ++i) {
    nlohmann::json row = {{"prompt", "Name a color " + std::to_string(i) + "."},
                          {"chosen", i % 2 ? "Blue, like the sky." : "Green."},
                          {"rejected", i % 2 ? "I will not." : "Seven is a number."}};
    if (margins) row["margin"] = 0.25 * i;
    rows.push_back(row);
  }
  write_file_atomic(p, rows.dump());
}

}  // namespace

TEST(RewardRecipe, CompileModesAgreeAndItWritesASequenceClassifier) {
  TempDir tmp;
  write_pairs(tmp / "pairs.json", 8);
  write_file_atomic(tmp / "cfg.yaml", reward_yaml(tmp / "run", tmp / "pairs.json"));
  std::vector<double> by_mode[3];
  int m = 0;
  for (const char* mode : {"false", "model", "true"}) {
    const fs::path out = tmp / (std::string("run_") + mode);
    ASSERT_EQ(cli::cmd_run({"reward_model_finetune_single_device", "--config",
                            (tmp / "cfg.yaml").string(), std::string("compile=") + mode,
                            "output_dir=" + out.string(), "center_rewards_coefficient=0.01"}),
              0);
    by_mode[m++] = logged_values(out, "loss");
  }
  ASSERT_EQ(by_mode[0].size(), 8u);
  EXPECT_NEAR(by_mode[0][0], std::log(2.0), 0.05);  // random scores near 0
  for (int k = 1; k < 3; ++k)
    for (size_t i = 0; i < by_mode[0].size(); ++i)
      EXPECT_NEAR(by_mode[k][i], by_mode[0][i], 1e-4 * std::max(1.0, std::abs(by_mode[0][i])))
          << "mode " << k << " step " << i + 1;
  const fs::path out = tmp / "run_true";
  for (const nlohmann::json& j : metrics_lines(out))
    for (const char* key : {"accuracy", "rewards/chosen", "rewards/rejected", "rewards/margins"})
      EXPECT_TRUE(j.contains(key)) << key << " in " << j.dump();
  const nlohmann::json config = nlohmann::json::parse(read_file(out / "epoch_1" / "config.json"));
  EXPECT_EQ(config.at("architectures"), nlohmann::json::array({"LlamaForSequenceClassification"}));
  EXPECT_EQ(config.at("pad_token_id"), 258) << "the byte tokenizer's pad id";
  HFCheckpoint ck = load_hf_checkpoint(out / "epoch_1");
  EXPECT_EQ(ck.config.num_labels, 1);
  EXPECT_EQ(ck.tensors.count("score.weight"), 1u);
  EXPECT_EQ(ck.tensors.count("lm_head.weight"), 0u);
}

// How users start: a causal LM checkpoint, loaded as a classifier with a fresh score head (no
// num_labels needed: the recipe trains a classifier of one score).
TEST(RewardRecipe, StartsFromACausalLmCheckpoint) {
  TempDir tmp;
  const fs::path ckpt = write_tiny_checkpoint(tmp.path());
  write_pairs(tmp / "pairs.json", 4);
  std::ostringstream s;
  s << "output_dir: " << (tmp / "run").string() << "\nmodel:\n  init: checkpoint\n"
    << "checkpointer:\n  checkpoint_dir: " << ckpt.string() << "\n"
    << "tokenizer:\n  _component_: byte\n  max_seq_len: 64\n"
    << "dataset:\n  _component_: preference\n  source: " << (tmp / "pairs.json").string() << "\n"
    << "batch_size: 2\noptimizer:\n  _component_: AdamW\n  lr: 1e-3\nnum_threads: 1\n"
    << "log_peak_memory_stats: false\n";
  write_file_atomic(tmp / "cfg.yaml", s.str());
  ASSERT_EQ(cli::cmd_run(
                {"reward_model_finetune_single_device", "--config", (tmp / "cfg.yaml").string()}),
            0);
  HFCheckpoint ck = load_hf_checkpoint(tmp / "run" / "epoch_0");
  EXPECT_EQ(ck.config.num_labels, 1);
  EXPECT_EQ(ck.tensors.count("lm_head.weight"), 0u);
  EXPECT_EQ(ck.tensors.at("score.weight").shape(), (Shape{1, 32}));
}

// The margin column enters the loss: lr 0 keeps the scores fixed, so the first step's loss
// with margins differs from the one without.
TEST(RewardRecipe, MarginColumnEntersTheLossAndABadOneNamesFileAndLine) {
  TempDir tmp;
  write_pairs(tmp / "plain.json", 4);
  write_pairs(tmp / "margins.json", 4, true);
  std::vector<double> loss[2];
  for (int k = 0; k < 2; ++k) {
    const fs::path data = tmp / (k ? "margins.json" : "plain.json");
    write_file_atomic(tmp / "cfg.yaml", reward_yaml(tmp / ("run" + std::to_string(k)), data));
    ASSERT_EQ(cli::cmd_run({"reward_model_finetune_single_device", "--config",
                            (tmp / "cfg.yaml").string(), "optimizer.lr=0", "shuffle=false"}),
              0);
    loss[k] = logged_values(tmp / ("run" + std::to_string(k)), "loss");
  }
  ASSERT_EQ(loss[0].size(), loss[1].size());
  EXPECT_GT(loss[1][1], loss[0][1] + 1e-3) << "margins 0.5, 0.75 raise the second step's loss";
  write_file_atomic(tmp / "bad.jsonl",
                    "{\"prompt\": \"a\", \"chosen\": \"b\", \"rejected\": \"c\"}\n"
                    "{\"prompt\": \"a\", \"chosen\": \"b\", \"rejected\": \"d\", \"margin\": "
                    "\"big\"}\n");
  write_file_atomic(tmp / "cfg.yaml", reward_yaml(tmp / "bad", tmp / "bad.jsonl"));
  const std::string e = error_of([&] {
    cli::cmd_run({"reward_model_finetune_single_device", "--config", (tmp / "cfg.yaml").string()});
  });
  EXPECT_TRUE(contains(e, "bad.jsonl line 2")) << e;
  EXPECT_TRUE(contains(e, "margin")) << e;
}

TEST(RewardRecipe, ALossSectionOrSampleDataIsRefused) {
  TempDir tmp;
  write_pairs(tmp / "pairs.json", 4);
  write_file_atomic(tmp / "cfg.yaml", reward_yaml(tmp / "run", tmp / "pairs.json"));
  const std::string cfg = (tmp / "cfg.yaml").string();
  EXPECT_TRUE(contains(error_of([&] {
                         cli::cmd_run({"reward_model_finetune_single_device", "--config", cfg,
                                       "loss._component_=DPOLoss"});
                       }),
                       "center_rewards_coefficient"));
  EXPECT_TRUE(contains(error_of([&] {
                         cli::cmd_run({"reward_model_finetune_single_device", "--config", cfg,
                                       "dataset._component_=text_completion"});
                       }),
                       "needs preference pairs"));
}

// The classifier's score of prompt + completion, from the scoring graph run eagerly on that one
// text.
double classifier_score(const HFCheckpoint& ck, const Tokenizer& tok, const std::string& text) {
  const TensorMap params(ck.tensors.begin(), ck.tensors.end());
  const std::vector<int32_t> ids = tok.encode(text, tok.default_add_bos(), false);
  const int64_t T = int64_t(ids.size());
  Graph g = build_sequence_scores_graph(ck.config, 1, T, DType::F32);
  Tensor tokens = Tensor::empty({1, T}, DType::I32), positions = Tensor::empty({1, T}, DType::I32);
  Tensor mask = Tensor::zeros({T}, DType::F32);
  for (int64_t t = 0; t < T; ++t) {
    tokens.data<int32_t>()[t] = ids[size_t(t)];
    positions.data<int32_t>()[t] = int32_t(t);
  }
  mask.data<float>()[T - 1] = 1.0f;
  const TensorMap in = {{"tokens", tokens}, {"positions", positions}, {"last_token_mask", mask}};
  return double(EagerExecutor(g).run(in, params)[0].data<float>()[0]);
}

// GRPO with a `reward_model` reward: the classifier trained by the recipe scores each completion.
// The reward set's scorer gives the classifier's score of prompt + completion (one batch of
// texts of different lengths, every compile mode), and a GRPO run with it as its only weighted
// reward logs that term as its reward.
TEST(RewardRecipe, GrpoScoresCompletionsWithTheTrainedRewardModel) {
  TempDir tmp;
  write_pairs(tmp / "pairs.json", 4);
  write_file_atomic(tmp / "rm.yaml", reward_yaml(tmp / "rm", tmp / "pairs.json"));
  ASSERT_EQ(cli::cmd_run({"reward_model_finetune_single_device", "--config",
                          (tmp / "rm.yaml").string(), "epochs=1"}),
            0);
  const fs::path rm = tmp / "rm" / "epoch_0";
  const HFCheckpoint ck = load_hf_checkpoint(rm);
  auto tok = load_tokenizer("byte", "");
  std::vector<ScoredCompletion> batch(3);
  batch[0] = {"Q What is 1 plus 2? A", " It is 3.", 9, true, {}};
  batch[1] = {"Q What is 5 plus 2? A", " Seven is a number and more words follow", 40, false, {}};
  batch[2] = {"Q x A", "!", 1, true, {}};
  const Config section =
      Config::from_string("reward_model: {checkpoint_dir: " + rm.string() + "}\n", "r.yaml");
  for (CompileMode mode : {CompileMode::None, CompileMode::Model, CompileMode::Full}) {
    const RewardSet set = RewardSet::from_config(
        section, [&](const Config& c) { return reward_model_scorer(c, *tok, mode); });
    const RewardSet::Scores s = set.score(batch);
    for (size_t i = 0; i < batch.size(); ++i)
      EXPECT_NEAR(s.total[i], classifier_score(ck, *tok, batch[i].prompt + batch[i].completion),
                  1e-5)
          << "completion " << i << " compile " << compile_mode_name(mode);
  }
  EXPECT_TRUE(contains(error_of([&] { RewardSet::from_config(section); }), "GRPO recipes"));

  std::string rows;
  for (int i = 0; i < 4; ++i)
    rows += nlohmann::json({{"question", "What is " + std::to_string(i) + " plus 2?"},
                            {"answer", "#### " + std::to_string(i + 2)}})
                .dump() +
            "\n";
  write_file_atomic(tmp / "p.jsonl", rows);
  std::ostringstream y;
  y << "output_dir: " << (tmp / "grpo").string() << "\n"
    << tiny_model_yaml(128) << "tokenizer:\n  _component_: byte\n"
    << "dataset:\n  _component_: gsm8k\n  source: " << (tmp / "p.jsonl").string()
    << "\n  prompt_template: \"Q {question} A\"\n"
    << "seed: 3\nshuffle: true\nbatch_size: 2\nepochs: 1\nmax_steps_per_epoch: 2\n"
    << "grpo_samples: 4\nmax_generated_tokens: 6\n"
    << "rewards:\n  reward_model: {checkpoint_dir: " << rm.string() << "}\n"
    << "  stop_token: {weight: 0}\n"
    << "optimizer:\n  _component_: AdamW\n  lr: 1e-2\n  weight_decay: 0.0\n"
    << "loss:\n  _component_: GRPOLoss\n  beta: 0.0\n"
    << "compile: true\nnum_threads: 1\nlog_every_n_steps: 1\nlog_peak_memory_stats: false\n";
  write_file_atomic(tmp / "grpo.yaml", y.str());
  ASSERT_EQ(
      cli::cmd_run({"grpo_full_finetune_single_device", "--config", (tmp / "grpo.yaml").string()}),
      0);
  const std::vector<double> term = logged_values(tmp / "grpo", "rewards/reward_model");
  const std::vector<double> reward = logged_values(tmp / "grpo", "reward");
  const std::vector<double> spread = logged_values(tmp / "grpo", "reward_std");
  ASSERT_EQ(term.size(), 2u);
  for (size_t i = 0; i < term.size(); ++i) {
    EXPECT_TRUE(std::isfinite(term[i]));
    EXPECT_EQ(reward[i], term[i]) << "step " << i + 1;
    EXPECT_GT(spread[i], 0.0) << "the completions of a prompt score differently";
  }

  // fusetune plan holds the classifier's fp32 weights through the run (and its scoring forward
  // in the rollout): the plan with the reward model has exactly its bytes more weights.
  int64_t classifier_bytes = 0;
  for (const auto& [name, t] : ck.tensors) classifier_bytes += t.numel() * 4;
  const auto planned_weights = [&](const std::vector<std::string>& keys) {
    Config cfg = load_config((tmp / "grpo.yaml").string());
    cfg.apply_overrides(keys);
    cfg = with_defaults(cfg, grpo_full_schema());
    const PlannedStep st =
        plan_step(cfg, "grpo_full_finetune_single_device", model_architecture(cfg));
    const ModePlan p = plan_step_mode(st, CompileMode::Full);
    return std::make_pair(p.memory.parameters, ::testing::PrintToString(p.passes));
  };
  const auto [with_rm, passes] = planned_weights({"dataset.max_seq_len=16"});
  const auto [without_rm, ignored] = planned_weights(
      {"dataset.max_seq_len=16", "~rewards.reward_model", "rewards.stop_token.weight=1"});
  EXPECT_EQ(with_rm - without_rm, classifier_bytes);
  EXPECT_TRUE(contains(passes, "reward model weights")) << passes;
}

// ---- reward_model_finetune_distributed (2 ranks x 1 thread): 2 ranks x b pairs give the losses
// and metrics of one process x 2b pairs (fp32, relative 1e-5), since the loss is a mean over the
// step's pairs and the normalizer is all-reduced over the ranks; a rerun is bitwise identical.
// (Named Dist*: ctest runs it with the MPI tests.)

namespace {

// Answers of different lengths, so each rank's rows are padded differently.
fs::path write_reward_pairs(const fs::path& dir) {
  nlohmann::json rows = nlohmann::json::array();
  for (int i = 0; i < 32; ++i) {
    const std::string tail(size_t(i * 7 % 23), char('a' + i % 26));
    rows.push_back({{"prompt", "Name a color " + std::to_string(i) + "."},
                    {"chosen", (i % 2 ? "Blue, like the sky " : "Green ") + tail},
                    {"rejected", (i % 3 ? "I will not " : "Seven is a number ") +
                                     std::string(size_t(i * 5 % 17), 'z')},
                    {"margin", 0.1 * (i % 4)}});
  }
  const fs::path p = dir / "pairs.json";
  write_text(p, rows.dump());
  return p;
}

std::string dist_reward_yaml(const fs::path& pairs) {
  std::ostringstream s;
  s << tiny_model_yaml(128) << "  num_labels: 1\n"
    << "tokenizer:\n  _component_: byte\n  max_seq_len: 64\n"
    << "dataset:\n  _component_: preference\n  source: " << pairs.string() << "\n"
    << "seed: 1\nshuffle: true\nepochs: 1\nmax_steps_per_epoch: 6\n"
    // lr 1e-3: at 1e-2 AdamW's normalized steps grow the summation-order differences of the
    // rank sums past 1e-5 by step 6.
    << "optimizer:\n  _component_: AdamW\n  lr: 1e-3\n  weight_decay: 0.0\n"
    << "center_rewards_coefficient: 0.01\nclip_grad_norm: 1.0\ncompile: false\n"
    << "num_threads: 1\nlog_every_n_steps: 1\nlog_peak_memory_stats: false\n";
  return s.str();
}

}  // namespace

TEST(DistReward, TwoRanksMatchOneProcessAndRerunsBitwise) {
  FT_REQUIRE_MPIRUN();
  const TempDir tmp;
  const fs::path config = tmp / "reward.yaml";
  write_text(config, dist_reward_yaml(write_reward_pairs(tmp.path())));
  const fs::path ref = tmp / "one";
  run_ok(run_command("reward_model_finetune_single_device", config.string(),
                     {{"output_dir", ref.string()}, {"batch_size", "4"}}),
         tmp / "s_one");
  const std::vector<double> want = losses_of(logged_steps(ref));
  ASSERT_EQ(want.size(), 6u);
  Overrides o{{"output_dir", (tmp / "two").string()}, {"batch_size", "2"}, {"zero_stage", "2"}};
  run_ok(mpirun_command(2, "reward_model_finetune_distributed", config.string(), o), tmp / "s_two");
  const std::vector<double> got = losses_of(logged_steps(tmp / "two"));
  expect_same_curve(got, want, "2 ranks x 2 pairs vs 1 x 4");
  for (const char* key : {"rewards/chosen", "rewards/rejected", "rewards/margins"}) {
    const std::vector<double> a = logged_values(tmp / "two", key), b = logged_values(ref, key);
    ASSERT_EQ(a.size(), b.size()) << key;
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_LE(std::abs(a[i] - b[i]), 1e-5 * std::abs(b[i]) + 1e-6) << key << " step " << i + 1;
  }
  o["output_dir"] = (tmp / "again").string();
  run_ok(mpirun_command(2, "reward_model_finetune_distributed", config.string(), o),
         tmp / "s_again");
  EXPECT_EQ(losses_of(logged_steps(tmp / "again")), got) << "rerun, bitwise";
}
