// The DPO recipes without assets: a random-init model with the byte tokenizer on preference
// pairs written here. The first step's loss is log 2 (policy = reference), QLoRA (NF4 base
// and head) runs in every compile mode with the same losses, and `fusetune plan` builds the
// recipe's own step (the fused log-prob kernels under compile: true, the reference pass).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "checks.h"
#include "fusetune/cli/command.h"
#include "fusetune/config/components.h"
#include "fusetune/config/config.h"
#include "fusetune/config/recipe_schemas.h"
#include "fusetune/config/schema.h"
#include "fusetune/recipes/dpo_step.h"
#include "fusetune/recipes/kto_kl.h"
#include "fusetune/util/fs.h"
#include "metrics_log.h"
#include "test_support.h"
#include "tiny_llama.h"

using namespace fusetune;
using namespace fusetune::testing;
namespace fs = std::filesystem;

namespace {

std::string dpo_yaml(const fs::path& out, const fs::path& data) {
  std::ostringstream s;
  s << "output_dir: " << out.string() << "\n"
    << tiny_model_yaml(128) << tiny_dpo_lora_yaml()
    << "tokenizer:\n  _component_: byte\n  max_seq_len: 64\n"
    << "dataset:\n  _component_: preference\n  source: " << data.string() << "\n"
    << "seed: 1\nshuffle: true\nbatch_size: 2\nepochs: 2\n"
    << "optimizer:\n  _component_: AdamW\n  lr: 1e-2\n  weight_decay: 0.0\n"
    << "loss:\n  _component_: DPOLoss\n  beta: 0.1\ncompile: false\nnum_threads: 1\n"
    << "log_every_n_steps: 1\nlog_peak_memory_stats: false\n";
  return s.str();
}

void write_pairs(const fs::path& p, int n) {
  nlohmann::json rows = nlohmann::json::array();
  for (int i = 0; i < n; ++i)
    rows.push_back({{"prompt", "Name a color " + std::to_string(i) + "."},
                    {"chosen", i % 2 ? "Blue, like the sky." : "Green."},
                    {"rejected", i % 2 ? "I will not." : "Seven is a number."}});
  write_file_atomic(p, rows.dump());
}

}  // namespace

TEST(DpoRecipe, QloraDpoStartsAtLog2AndCompileModesAgree) {
  TempDir tmp;
  write_pairs(tmp / "pairs.json", 8);
  write_file_atomic(tmp / "cfg.yaml", dpo_yaml(tmp / "run", tmp / "pairs.json"));
  std::vector<double> by_mode[3];
  int m = 0;
  for (const char* mode : {"false", "model", "true"}) {
    const fs::path out = tmp / (std::string("run_") + mode);
    ASSERT_EQ(cli::cmd_run({"lora_dpo_single_device", "--config", (tmp / "cfg.yaml").string(),
                            std::string("compile=") + mode, "model.quantize_base=true",
                            "output_dir=" + out.string()}),
              0);
    by_mode[m++] = logged_values(out, "loss");
    EXPECT_TRUE(fs::exists(out / "epoch_1" / "adapter_model.safetensors"));
  }
  ASSERT_EQ(by_mode[0].size(), 8u);
  EXPECT_NEAR(by_mode[0][0], std::log(2.0), 1e-6);
  for (int k = 1; k < 3; ++k)
    for (size_t i = 0; i < by_mode[0].size(); ++i)
      EXPECT_NEAR(by_mode[k][i], by_mode[0][i], 1e-4 * std::max(1.0, std::abs(by_mode[0][i])))
          << "mode " << k << " step " << i + 1;
}

// dtype: bf16. The per-sequence log-probs and the preference arithmetic stay fp32 (a
// sequence's log-prob is ~-1000: bf16's step there is 4, which made policy - reference
// noise and the first loss 0.674 instead of log 2 before they did). The curve follows fp32's.
TEST(DpoRecipe, Bf16DpoStartsAtLog2AndFollowsFp32) {
  TempDir tmp;
  write_pairs(tmp / "pairs.json", 8);
  write_file_atomic(tmp / "cfg.yaml", dpo_yaml(tmp / "run", tmp / "pairs.json"));
  std::vector<double> by_dtype[2];
  int k = 0;
  for (const char* dtype : {"fp32", "bf16"}) {
    const fs::path out = tmp / (std::string("run_") + dtype);
    ASSERT_EQ(
        cli::cmd_run({"lora_dpo_single_device", "--config", (tmp / "cfg.yaml").string(),
                      "compile=true", std::string("dtype=") + dtype, "output_dir=" + out.string()}),
        0);
    by_dtype[k++] = logged_values(out, "loss");
  }
  ASSERT_EQ(by_dtype[1].size(), 8u);
  EXPECT_NEAR(by_dtype[1][0], std::log(2.0), 1e-6);
  for (size_t i = 0; i < by_dtype[0].size(); ++i)
    EXPECT_NEAR(by_dtype[1][i], by_dtype[0][i], 0.05 * by_dtype[0][i]) << "step " << i + 1;
}

TEST(DpoRecipe, IdenticalAnswersAreABadRowNamedByFileAndLine) {
  TempDir tmp;
  write_file_atomic(tmp / "pairs.jsonl",
                    "{\"prompt\": \"a\", \"chosen\": \"b\", \"rejected\": \"c\"}\n"
                    "{\"prompt\": \"a\", \"chosen\": \"same\", \"rejected\": \"same\"}\n");
  write_file_atomic(tmp / "cfg.yaml", dpo_yaml(tmp / "run", tmp / "pairs.jsonl"));
  try {
    cli::cmd_run({"lora_dpo_single_device", "--config", (tmp / "cfg.yaml").string()});
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("pairs.jsonl line 2"), std::string::npos) << what;
    EXPECT_NE(what.find("identical"), std::string::npos) << what;
  }
}

TEST(DpoRecipe, PlanBuildsThePreferenceStepAndTheReferencePass) {
  TempDir tmp;
  write_pairs(tmp / "pairs.json", 4);
  write_file_atomic(tmp / "cfg.yaml", dpo_yaml(tmp / "run", tmp / "pairs.json"));
  ::testing::internal::CaptureStdout();
  const int rc = cli::cmd_plan({"lora_dpo_single_device", "--config", (tmp / "cfg.yaml").string()});
  const std::string plan = ::testing::internal::GetCapturedStdout();
  ASSERT_EQ(rc, 0) << plan;
  EXPECT_NE(plan.find("step of 4 x 64 tokens"), std::string::npos) << plan;  // 2 pairs = 4 rows
  EXPECT_NE(plan.find("fused_linear_log_probs_backward"), std::string::npos) << plan;
  EXPECT_NE(plan.find("reference forward (every step"), std::string::npos) << plan;
}

// Validation on preference pairs: the mean DPO loss over the held-out pairs. With lr 0 the
// policy stays the reference, so every pair's loss is log 2 (the same data as a check: the
// value is independent of what the pairs say).
TEST(DpoRecipe, ValidationLossIsLog2WhileThePolicyIsTheReference) {
  TempDir tmp;
  write_pairs(tmp / "pairs.json", 8);
  write_file_atomic(tmp / "cfg.yaml", dpo_yaml(tmp / "run", tmp / "pairs.json"));
  ASSERT_EQ(
      cli::cmd_run(
          {"lora_dpo_single_device", "--config", (tmp / "cfg.yaml").string(), "optimizer.lr=0",
           "run_val_every_n_steps=2", "dataset_val._component_=preference",
           "dataset_val.source=" + (tmp / "pairs.json").string(), "dataset_val.split=train[4:]"}),
      0);
  const std::vector<double> val = logged_values(tmp / "run", "val_loss");
  ASSERT_EQ(val.size(), 4u);  // 8 steps (2 epochs of 4), every 2
  for (double v : val) EXPECT_NEAR(v, std::log(2.0), 1e-6);
}

// ---- preference losses: the config mapping and the recipes' first step ----------------------

// Every name the config accepts under `loss._component_` (each component's name and aliases,
// read from the table itself) maps to the loss this test expects, with that loss's keys read
// into the right fields and the schema's defaults when absent. A name added to the table
// without a row here fails, as does one removed.
TEST(PreferenceLossConfig, EveryLossNameAndAliasMapsToItsLoss) {
  using K = PreferenceLossKind;
  const std::map<std::string, K> expected = {
      {"DPOLoss", K::DPO},
      {"torchtune.rlhf.loss.DPOLoss", K::DPO},
      {"torchtune.modules.rlhf.loss.DPOLoss", K::DPO},
      {"sigmoid", K::DPO},  // TRL's loss_type for DPO (summed log-probs)
      {"RSOLoss", K::RSO},
      {"torchtune.rlhf.loss.RSOLoss", K::RSO},
      {"torchtune.modules.rlhf.loss.RSOLoss", K::RSO},
      {"hinge", K::RSO},  // TRL's hinge: relu(1 - beta d), RSOLoss's gamma
      {"IPOLoss", K::IPO},
      {"torchtune.rlhf.loss.IPOLoss", K::IPO},
      {"torchtune.modules.rlhf.loss.IPOLoss", K::IPO},
      {"SimPOLoss", K::SimPO},
      {"torchtune.rlhf.loss.SimPOLoss", K::SimPO},
      {"torchtune.modules.rlhf.loss.SimPOLoss", K::SimPO},
      {"simpo", K::SimPO},  // TRL's CPO trainer with loss_type simpo
      {"ORPOLoss", K::ORPO},
      {"orpo", K::ORPO},  // TRL's ORPOTrainer
      {"KTOLoss", K::KTO},
      {"kto", K::KTO}};  // TRL's KTOTrainer
  const std::set<std::string> cross_entropy = {
      "cross_entropy", "torchtune.modules.loss.CEWithChunkedOutputLoss",
      "torchtune.modules.loss.LinearCrossEntropyLoss", "torch.nn.CrossEntropyLoss"};
  const ComponentTable* table = component_table("loss");
  ASSERT_NE(table, nullptr);
  std::set<std::string> accepted;
  for (const Component& c : table->components) {
    std::vector<std::string> names = c.aliases;
    names.insert(names.begin(), c.name);
    for (const std::string& name : names) {
      SCOPED_TRACE(name);
      const Config bare = Config::from_string("loss:\n  _component_: " + name + "\n", "t.yaml");
      // The GRPO recipes' (recipe_grpo_test.cpp) and PPO's (recipe_ppo_test.cpp).
      if (name.find("GRPO") != std::string::npos || name.find("PPOLoss") != std::string::npos) {
        EXPECT_TRUE(
            contains(error_of([&] { preference_loss_from(bare); }), "the DPO recipes train with"));
        continue;
      }
      accepted.insert(name);
      if (cross_entropy.count(name)) {
        EXPECT_TRUE(contains(error_of([&] { preference_loss_from(bare); }),
                             "config key 'loss._component_' is cross_entropy: the DPO recipes "
                             "train with DPOLoss, RSOLoss, IPOLoss, SimPOLoss, ORPOLoss or "
                             "KTOLoss"));
        continue;
      }
      const auto want = expected.find(name);
      ASSERT_NE(want, expected.end()) << "a loss name the config accepts that this test lacks";
      const PreferenceLoss l = preference_loss_from(bare);
      EXPECT_EQ(l.kind, want->second);
      EXPECT_EQ(std::string(l.name()), c.name);  // the canonical name, whatever was written
      // The loss's fields, by config key; every key the component accepts is one of them.
      auto field = [](PreferenceLoss& x, const std::string& key) -> double* {
        if (key == "beta") return &x.beta;
        if (key == "label_smoothing") return &x.label_smoothing;
        if (key == "gamma") return &x.gamma;
        if (key == "tau") return &x.tau;
        if (key == "desirable_weight") return &x.desirable_weight;
        if (key == "undesirable_weight") return &x.undesirable_weight;
        return nullptr;
      };
      PreferenceLoss absent = l;
      std::string set_all = "loss:\n  _component_: " + name + "\n";
      std::map<std::string, double> given;
      double v = 0.11;
      for (const Field& f : c.fields) {
        ASSERT_NE(field(absent, f.name), nullptr) << "key " << f.name;
        // Absent: the schema's default.
        ASSERT_FALSE(f.default_yaml.empty()) << "key " << f.name;
        EXPECT_DOUBLE_EQ(*field(absent, f.name), std::stod(f.default_yaml)) << "key " << f.name;
        given[f.name] = v;
        set_all += "  " + f.name + ": " + std::to_string(v) + "\n";
        v += 0.07;
      }
      EXPECT_FALSE(given.empty());
      PreferenceLoss read = preference_loss_from(Config::from_string(set_all, "t.yaml"));
      for (const auto& [key, value] : given)
        EXPECT_DOUBLE_EQ(*field(read, key), value) << "key " << key;
    }
  }
  for (const auto& [name, kind] : expected) EXPECT_TRUE(accepted.count(name)) << name;
  EXPECT_EQ(accepted.size(), expected.size() + cross_entropy.size());
  // TRL's `ipo` divides each sequence's log-probs by its length; torchtune's IPOLoss (the one
  // here) sums them, so `ipo` is no alias of it.
  EXPECT_FALSE(accepted.count("ipo"));
  const std::string ipo_error = error_of(
      [] { preference_loss_from(Config::from_string("loss:\n  _component_: ipo\n", "t.yaml")); });
  EXPECT_TRUE(contains(ipo_error,
                       "unknown loss._component_ 'ipo': TRL's loss_type ipo is IPO on each "
                       "answer's log-probs averaged over its tokens, while IPOLoss (torchtune's) "
                       "sums them: another loss, not an alias of IPOLoss"))
      << ipo_error;
  EXPECT_FALSE(contains(ipo_error, "did you mean")) << ipo_error;  // not simpo
  const std::string invalid = error_of([] {
    validate(
        Config::from_string(
            "loss: {_component_: ipo}\n" + tiny_model_yaml(64) + tiny_dpo_lora_yaml(), "t.yaml"),
        lora_dpo_schema());
  });
  EXPECT_TRUE(contains(invalid, "unknown loss._component_ 'ipo': TRL's loss_type ipo")) << invalid;
  EXPECT_FALSE(contains(invalid, "did you mean")) << invalid;
}

namespace {

// One optimizer step of `recipe` on `pairs_per_step` pairs with `loss` (a YAML map), its
// metrics line; `name` names the run under `tmp`. full_dpo_single_device trains a checkpoint of the
// same tiny model against a frozen copy of it; lora_dpo_single_device the random model's adapters.
nlohmann::json first_step(const TempDir& tmp, const std::string& name, const std::string& recipe,
                          const std::string& loss, int pairs_per_step) {
  const fs::path out = tmp / name;
  write_pairs(tmp / "pairs.json", 4);
  write_file_atomic(tmp / "cfg.yaml", dpo_yaml(out, tmp / "pairs.json"));
  std::vector<std::string> args = {recipe,
                                   "--config",
                                   (tmp / "cfg.yaml").string(),
                                   "~loss",
                                   "loss=" + loss,
                                   "epochs=1",
                                   "max_steps_per_epoch=1",
                                   "batch_size=" + std::to_string(pairs_per_step)};
  if (recipe == "full_dpo_single_device") {
    const fs::path ck =
        fs::exists(tmp / "ck" / "ckpt") ? tmp / "ck" / "ckpt" : write_tiny_checkpoint(tmp / "ck");
    const std::string files =
        "{checkpoint_dir: " + ck.string() + ", checkpoint_files: [model.safetensors]}";
    for (const std::string& a : {std::string("~model"), std::string("model={init: checkpoint}"),
                                 "checkpointer=" + files, "ref_checkpointer=" + files})
      args.push_back(a);
  }
  EXPECT_EQ(cli::cmd_run(args), 0);
  const std::vector<nlohmann::json> lines = metrics_lines(out);
  EXPECT_EQ(lines.size(), 1u);
  return lines.empty() ? nlohmann::json::object() : lines[0];
}

}  // namespace

// At step 1 the policy is the reference (LoRA's B is zero; full DPO's policy and reference
// load one checkpoint), so with d = (pc - pr) - (rc - rr) = 0 each reference-based loss has a
// closed form, and every reward (a multiple of the policy/reference log-ratio) is 0:
//   RSO (Liu et al. 2023, hinge):  relu(1 - gamma d)        = 1
//   IPO (Azar et al. 2023):        (d - 1 / (2 tau))^2      = 1 / (4 tau^2) = 4 at tau 0.25
// (DPO's -log sigmoid(beta d) = log 2 is checked above.)
TEST(DpoRecipe, RsoAndIpoFirstStepLossesAreTheirClosedFormsInBothRecipes) {
  for (const std::string recipe : {"lora_dpo_single_device", "full_dpo_single_device"}) {
    SCOPED_TRACE(recipe);
    TempDir tmp;
    const nlohmann::json rso =
        first_step(tmp, "rso", recipe, "{_component_: RSOLoss, gamma: 0.3}", 2);
    EXPECT_NEAR(rso.value("loss", 0.0), 1.0, 1e-6);
    const nlohmann::json ipo =
        first_step(tmp, "ipo", recipe, "{_component_: IPOLoss, tau: 0.25}", 2);
    EXPECT_NEAR(ipo.value("loss", 0.0), 1.0 / (4 * 0.25 * 0.25), 1e-5);
    for (const nlohmann::json* j : {&rso, &ipo})
      for (const char* key : {"rewards/chosen", "rewards/rejected", "rewards/margins"})
        EXPECT_NEAR(j->value(key, 1.0), 0.0, 1e-6) << key;
  }
}

// KTO's KL rows: each row's prompt with the previous row's completion (TRL's rotation), an
// untrained token inside a completion kept untrained, and max_seq_len cutting the rows.
TEST(KtoKlRows, EachPromptGetsThePreviousRowsCompletion) {
  constexpr int32_t I = kIgnoreIndex;
  Batch b;
  b.batch_size = 2;
  b.seq_len = 8;
  // Row 0: prompt 1 2, response 3 4 5. Row 1: prompt 6 7 8, response 9 10 11 with 10 untrained.
  b.tokens = {1, 2, 3, 4, 5, 0, 0, 0, 6, 7, 8, 9, 10, 11, 0, 0};
  b.labels = {I, 3, 4, 5, I, I, I, I, I, I, 9, I, 11, I, I, I};
  b.positions = {0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7};
  CollateOptions o;
  o.pad_mode = PadMode::kLongest;
  o.pad_id = 0;
  Batch m = mismatched_completions(b, o);
  ASSERT_EQ(m.batch_size, 2);
  ASSERT_EQ(m.seq_len, 6);
  EXPECT_EQ(m.tokens, (std::vector<int32_t>{1, 2, 9, 10, 11, 0, 6, 7, 8, 3, 4, 5}));
  EXPECT_EQ(m.labels, (std::vector<int32_t>{I, 9, I, 11, I, I, I, I, 3, 4, 5, I}));
  o.max_seq_len = 4;
  m = mismatched_completions(b, o);
  ASSERT_EQ(m.seq_len, 4);
  EXPECT_EQ(m.tokens, (std::vector<int32_t>{1, 2, 9, 10, 6, 7, 8, 3}));
  EXPECT_EQ(m.labels, (std::vector<int32_t>{I, 9, I, I, I, I, 3, I}));
  // A row without a response (nothing to split) is an error naming the row.
  b.labels = std::vector<int32_t>(16, I);
  EXPECT_TRUE(contains(error_of([&] { mismatched_completions(b, o); }),
                       "KTOLoss: row 0 of the batch has no response"));
}

// KTO (Ethayarajh et al. 2024) at step 1, where the policy is the reference: every log-ratio
// and the KL reference point z are 0, so each answer's loss is w (1 - sigmoid(0)) = w / 2 and a
// pair's is their mean, (w_d + w_u) / 4 (TRL: the mean over the batch's examples).
TEST(DpoRecipe, KtoFirstStepLossIsHalfTheMeanWeightWhileThePolicyIsTheReference) {
  for (const std::string recipe : {"lora_dpo_single_device", "full_dpo_single_device"}) {
    SCOPED_TRACE(recipe);
    TempDir tmp;
    const nlohmann::json j =
        first_step(tmp, "kto", recipe,
                   "{_component_: KTOLoss, desirable_weight: 2.0, undesirable_weight: 1.0}", 2);
    EXPECT_NEAR(j.value("loss", 0.0), (2.0 + 1.0) / 4, 1e-6);
    EXPECT_NEAR(j.value("kl", 1.0), 0.0, 1e-6);
    for (const char* key : {"rewards/chosen", "rewards/rejected", "rewards/margins"})
      EXPECT_NEAR(j.value(key, 1.0), 0.0, 1e-6) << key;
  }
  // Its KL rows split prompts from completions: train_on_input would leave no prompt.
  const std::string bad = error_of([] {
    preference_loss_from(Config::from_string(
        "loss:\n  _component_: KTOLoss\ndataset:\n  train_on_input: true\n", "t.yaml"));
  });
  EXPECT_TRUE(contains(bad, "KTOLoss needs dataset.train_on_input: false")) << bad;
}

namespace {

// The pairs in `pairs` written as TRL's unpaired rows (prompt, completion, label), in the order
// an unshuffled paired batch of `per_batch` pairs lays out its rows (their chosen answers, then
// their rejected ones): an unpaired batch of 2 x per_batch rows is then that paired batch.
void write_unpaired(const fs::path& p, const fs::path& pairs, size_t per_batch) {
  const nlohmann::json in = nlohmann::json::parse(read_file(pairs));
  nlohmann::json rows = nlohmann::json::array();
  for (size_t start = 0; start < in.size(); start += per_batch)
    for (const char* side : {"chosen", "rejected"})
      for (size_t i = start; i < std::min(in.size(), start + per_batch); ++i)
        rows.push_back({{"prompt", in[i]["prompt"]},
                        {"completion", in[i][side]},
                        {"label", std::string(side) == "chosen"}});
  write_file_atomic(p, rows.dump());
}

std::vector<std::string> kto_run(const TempDir& tmp, const std::string& name,
                                 std::vector<std::string> extra) {
  std::vector<std::string> args = {"lora_dpo_single_device",
                                   "--config",
                                   (tmp / "cfg.yaml").string(),
                                   "~loss",
                                   "loss={_component_: KTOLoss, beta: 0.2, desirable_weight: 2.0, "
                                   "undesirable_weight: 1.0}",
                                   "shuffle=false",
                                   "output_dir=" + (tmp / name).string()};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

}  // namespace

// KTO on TRL's unpaired rows goes through the same loss as on pairs: the pairs written as
// unpaired rows (a paired batch's chosen rows, then its rejected ones) train to the same losses
// and metrics, step by step (each loss the mean over the batch's examples, TRL's).
TEST(DpoRecipe, KtoOnPairsAndOnThemWrittenUnpairedTrainsTheSame) {
  TempDir tmp;
  write_pairs(tmp / "pairs.json", 8);
  write_unpaired(tmp / "rows.json", tmp / "pairs.json", 2);
  write_file_atomic(tmp / "cfg.yaml", dpo_yaml(tmp / "run", tmp / "pairs.json"));
  ASSERT_EQ(cli::cmd_run(kto_run(tmp, "paired", {"batch_size=2", "epochs=1"})), 0);
  ASSERT_EQ(
      cli::cmd_run(kto_run(tmp, "unpaired",
                           {"batch_size=4", "epochs=1", "dataset._component_=unpaired_preference",
                            "dataset.source=" + (tmp / "rows.json").string()})),
      0);
  const auto paired = metrics_lines(tmp / "paired"), unpaired = metrics_lines(tmp / "unpaired");
  ASSERT_EQ(paired.size(), 4u);
  ASSERT_EQ(unpaired.size(), paired.size());
  for (size_t i = 0; i < paired.size(); ++i)
    for (const char* key :
         {"loss", "kl", "rewards/chosen", "rewards/rejected", "rewards/margins", "log_probs/chosen",
          "log_probs/rejected", "logits/chosen", "logits/rejected"}) {
      ASSERT_TRUE(unpaired[i].contains(key)) << key;
      const double want = paired[i].value(key, 0.0);
      EXPECT_NEAR(unpaired[i].value(key, 1e9), want, 1e-5 * std::max(1.0, std::abs(want)))
          << key << " step " << i + 1;
    }
  EXPECT_GT(paired.back().value("kl", 0.0) + std::abs(paired.back().value("rewards/margins", 0.0)),
            0.0);                                            // it trained
  EXPECT_FALSE(unpaired[0].contains("rewards/accuracies"));  // no pairs to compare
}

// Unpaired KTO at steps where the policy is the reference (lr 0): every log-ratio and z are 0, so
// a row's loss is w / 2 and the step's their mean over the rows: (3 w_d + w_u) / 8 for a batch
// of 3 desirable rows and 1 undesirable. A batch of one kind is defined: its other kind's metrics
// log 0. DPOLoss refuses unpaired data, and validation data must be of the training data's kind.
TEST(DpoRecipe, UnpairedKtoFirstStepsAreTheWeightedMeanAndOneKindBatchesAreDefined) {
  TempDir tmp;
  nlohmann::json rows = nlohmann::json::array();
  for (bool label : {true, true, true, false, true, true, true, true})
    rows.push_back(
        {{"prompt", "Say a word."}, {"completion", label ? "Yes." : "No!"}, {"label", label}});
  write_file_atomic(tmp / "rows.json", rows.dump());
  write_file_atomic(tmp / "cfg.yaml", dpo_yaml(tmp / "run", tmp / "rows.json"));
  ASSERT_EQ(cli::cmd_run(kto_run(tmp, "run",
                                 {"batch_size=4", "epochs=1", "optimizer.lr=0",
                                  "dataset._component_=unpaired_preference"})),
            0);
  const auto lines = metrics_lines(tmp / "run");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NEAR(lines[0].value("loss", 0.0), (3 * 2.0 + 1.0) / 8, 1e-6);
  EXPECT_NEAR(lines[1].value("loss", 0.0), 2.0 / 2, 1e-6);
  for (const auto& j : lines)
    for (const char* key : {"kl", "rewards/chosen", "rewards/rejected", "rewards/margins"})
      EXPECT_NEAR(j.value(key, 1.0), 0.0, 1e-6) << key;
  EXPECT_LT(lines[1].value("log_probs/chosen", 0.0), -1.0);
  EXPECT_EQ(lines[1].value("log_probs/rejected", 1.0), 0.0);  // no undesirable row
  // The run's config with DPOLoss: refused at validation, as is validation data of another kind.
  std::string base = dpo_yaml(tmp / "run", tmp / "rows.json");
  base.replace(base.find("_component_: preference"), 23, "_component_: unpaired_preference");
  const std::string dpo =
      error_of([&] { validate(Config::from_string(base, "t.yaml"), lora_dpo_schema()); });
  EXPECT_TRUE(contains(dpo,
                       "'dataset._component_' is unpaired_preference, which only KTOLoss "
                       "trains on; DPOLoss needs preference pairs"))
      << dpo;
  base.replace(base.find("_component_: DPOLoss"), 20, "_component_: KTOLoss");
  const std::string val = error_of([&] {
    validate(Config::from_string(
                 base + "dataset_val:\n  _component_: preference\n  source: p.json\n", "t.yaml"),
             lora_dpo_schema());
  });
  EXPECT_TRUE(contains(val,
                       "'dataset_val._component_' is preference, but dataset is "
                       "unpaired_preference"))
      << val;
}

// ORPO (Hong et al. 2024) has no reference. With m_c, m_r the mean log-probs of the chosen and
// rejected responses (logged as log_probs/*), the paper's loss of a pair is
//   L = -m_c - beta log sigmoid(log(odds_c / odds_r)),  odds = exp(m) / (1 - exp(m)),
// written here from the logged means with plain exp/log: the first step's loss, and the
// nll_loss / log_odds_* metrics TRL's ORPOTrainer logs. rewards/* are beta m (TRL's).
TEST(DpoRecipe, OrpoFirstStepLossIsThePapersFormulaOfTheLoggedMeanLogProbs) {
  const double beta = 0.25;
  for (const std::string recipe : {"lora_dpo_single_device", "full_dpo_single_device"}) {
    SCOPED_TRACE(recipe);
    TempDir tmp;
    const nlohmann::json j =
        first_step(tmp, "orpo", recipe, "{_component_: ORPOLoss, beta: 0.25}", 1);
    const double mc = j.value("log_probs/chosen", 0.0), mr = j.value("log_probs/rejected", 0.0);
    const double odds_c = std::exp(mc) / (1 - std::exp(mc)),
                 odds_r = std::exp(mr) / (1 - std::exp(mr));
    const double lo = std::log(odds_c / odds_r);
    const double ratio = std::log(1 / (1 + std::exp(-lo)));
    EXPECT_NEAR(j.value("loss", 0.0), -mc - beta * ratio, 1e-5);
    EXPECT_NEAR(j.value("nll_loss", 0.0), -mc, 1e-5);
    EXPECT_NEAR(j.value("log_odds_chosen", 0.0), lo, 1e-4);
    EXPECT_NEAR(j.value("log_odds_ratio", 0.0), ratio, 1e-5);
    EXPECT_NEAR(j.value("rewards/chosen", 0.0), beta * mc, 1e-5);
    EXPECT_NEAR(j.value("rewards/rejected", 0.0), beta * mr, 1e-5);
    // A mean log-prob per token near -log 259 (a random model), not a sum.
    EXPECT_LT(mc, -0.5 * std::log(259.0));
    EXPECT_GT(mc, -2.0 * std::log(259.0));
  }
}

// SimPO (Meng et al. 2024) has no reference: with m the mean log-prob of a response's tokens,
// the loss of a pair is -log sigmoid(beta (m_c - m_r) - gamma) = log(1 + exp(gamma - margin)),
// margin = beta (m_c - m_r) (logged as rewards/margins; rewards/chosen = beta m_c). With one
// pair per step the step's loss is that pair's. log_probs/{chosen,rejected} are the means m
// (torchtune's recipe and TRL log what the loss uses), so log_probs/chosen = rewards/chosen /
// beta; a random model's m is near -log 259 per token, far from the sums.
TEST(DpoRecipe, SimpoFirstStepLossIsItsClosedFormAndLogsMeanLogProbs) {
  const double beta = 2.0, gamma = 0.5;  // SimPOLoss's defaults
  for (const std::string recipe : {"lora_dpo_single_device", "full_dpo_single_device"}) {
    SCOPED_TRACE(recipe);
    TempDir tmp;
    const nlohmann::json j = first_step(tmp, "simpo", recipe, "{_component_: SimPOLoss}", 1);
    const double margin = j.value("rewards/margins", 0.0);
    EXPECT_NEAR(j.value("loss", 0.0), std::log1p(std::exp(gamma - margin)), 1e-5);
    EXPECT_NEAR(j.value("rewards/margins", 0.0),
                j.value("rewards/chosen", 0.0) - j.value("rewards/rejected", 0.0), 1e-5);
    for (const char* side : {"chosen", "rejected"}) {
      const double mean = j.value(std::string("log_probs/") + side, 0.0);
      EXPECT_NEAR(mean, j.value(std::string("rewards/") + side, 0.0) / beta, 1e-5) << side;
      EXPECT_LT(mean, -0.5 * std::log(259.0)) << side;
      EXPECT_GT(mean, -2.0 * std::log(259.0)) << side;
    }
  }
}
