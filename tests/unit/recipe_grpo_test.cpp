// The GRPO recipes without assets (recipes/grpo_recipes.h, grpo_step.h): a random-init model
// with the byte tokenizer, prompts written here (dataset kind gsm8k) and an external reward
// (an awk count of a letter), so the completions of a prompt score differently. The first
// update's ratio is 1 (loss = -mean advantage = 0 and nothing clipped), the three compile
// modes agree, num_iterations keeps one rollout over that many steps and clipping acts from
// the second, the LoRA reference is the base (KL 0 at the start), resume at a rollout
// boundary is bitwise the uninterrupted run, and bad keys are refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fusetune/cli/command.h"
#include "fusetune/config/builtin_configs.h"
#include "fusetune/config/config.h"
#include "fusetune/config/recipe_schemas.h"
#include "fusetune/config/schema.h"
#include "fusetune/data/datasets/prompts.h"
#include "fusetune/recipes/grpo_recipes.h"
#include "fusetune/recipes/recipe_setup.h"
#include "fusetune/recipes/registry.h"
#include "fusetune/recipes/step_plan.h"
#include "fusetune/tokenizers/load_tokenizer.h"
#include "fusetune/util/error.h"
#include "fusetune/util/fs.h"
#include "metrics_log.h"
#include "test_support.h"
#include "tiny_llama.h"

using namespace fusetune;
using namespace fusetune::testing;
namespace fs = std::filesystem;

namespace {

void write_problems(const fs::path& p, int n) {
  std::string rows;
  for (int i = 0; i < n; ++i)
    rows += nlohmann::json(
                {{"question", "What is " + std::to_string(i) + " plus 2?"},
                 {"answer", "It is " + std::to_string(i + 2) + ".\n#### " + std::to_string(i + 2)}})
                .dump() +
            "\n";
  write_file_atomic(p, rows);
}

std::string grpo_yaml(const fs::path& data, bool lora) {
  std::ostringstream s;
  s << "output_dir: /tmp/unused\n"
    << tiny_model_yaml(128) << (lora ? tiny_dpo_lora_yaml() : "")
    << "tokenizer:\n  _component_: byte\n"
    << "dataset:\n  _component_: gsm8k\n  source: " << data.string()
    << "\n  prompt_template: \"Q {question} A\"\n"
    << "seed: 3\nshuffle: true\nbatch_size: 2\nepochs: 1\nmax_steps_per_epoch: 3\n"
    << "grpo_samples: 4\nmax_generated_tokens: 6\ntemperature: 1.0\n"
    << "rewards:\n  external: {command: \"awk '{print gsub(/e/, \\\"e\\\")}'\"}\n"
    << "optimizer:\n  _component_: AdamW\n  lr: 1e-2\n  weight_decay: 0.0\n"
    << "loss:\n  _component_: GRPOLoss\n  loss_type: grpo\n  beta: 0.0\n"
    << "compile: false\nnum_threads: 1\nlog_every_n_steps: 1\nlog_peak_memory_stats: false\n";
  return s.str();
}

int run_grpo(const std::string& recipe, const fs::path& cfg, const fs::path& out,
             std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {recipe, "--config", cfg.string(), "output_dir=" + out.string()};
  for (auto& e : extra) args.push_back(e);
  return cli::cmd_run(args);
}

}  // namespace

TEST(PromptDataset, TemplatesTheQuestionKeepsTheColumnsAndPartitions) {
  TempDir tmp;
  write_problems(tmp / "p.jsonl", 10);
  DatasetOptions o;
  o.kind = "gsm8k";
  o.source = (tmp / "p.jsonl").string();
  o.partition = "1-2/5";  // rows 2..5 of 10
  auto tok = load_tokenizer("byte", "");
  auto ds = datasets::load_prompts(o, *tok, "Q: {question}\nA:");
  ASSERT_EQ(ds->size(), 4);
  EXPECT_EQ(ds->row(0).text, "Q: What is 2 plus 2?\nA:");
  EXPECT_EQ(ds->row(0).columns.at("answer"), "It is 4.\n#### 4");
  EXPECT_EQ(ds->get(0).tokens, tok->encode(ds->row(0).text, tok->default_add_bos(), false));
  for (int32_t l : ds->get(3).labels) EXPECT_EQ(l, kIgnoreIndex);
  EXPECT_EQ(datasets::split_with_partition("train", "1-9/10"), "train[10%:100%]");
  EXPECT_EQ(datasets::split_with_partition("train", "0/4"), "train[0%:25%]");
  EXPECT_THROW(datasets::split_with_partition("train", "3-1/4"), Error);
  EXPECT_THROW(datasets::split_with_partition("train[:5]", "0/2"), Error);
  // A .txt document is a question; a long prompt keeps its first max_seq_len tokens.
  write_file_atomic(tmp / "s.txt", "Once upon a time there was a dog.\n\nThe sun was up.\n");
  o.source = (tmp / "s.txt").string();
  o.partition.clear();
  o.max_seq_len = 6;
  auto stories = datasets::load_prompts(o, *tok, "{question}");
  ASSERT_EQ(stories->size(), 2);
  EXPECT_EQ(stories->get(0).tokens.size(), 6u);
  EXPECT_EQ(stories->row(0).text, "Once ");  // BOS and the bytes of "Once "
  EXPECT_EQ(stories->report().truncated, 2);
  o.max_seq_len = 0;
  // A row without the question column is named by file and line.
  write_file_atomic(tmp / "bad.jsonl", "{\"question\": \"a\"}\n{\"q\": \"b\"}\n");
  o.source = (tmp / "bad.jsonl").string();
  try {
    datasets::load_prompts(o, *tok, "{question}");
    FAIL() << "a row without its question loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.jsonl line 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("question"), std::string::npos) << e.what();
  }
}

TEST(GrpoRecipe, FirstUpdateHasRatioOneAndCompileModesAgree) {
  TempDir tmp;
  write_problems(tmp / "p.jsonl", 12);
  write_file_atomic(tmp / "cfg.yaml", grpo_yaml(tmp / "p.jsonl", false));
  std::vector<double> loss[3], reward[3];
  int m = 0;
  for (const char* mode : {"false", "model", "true"}) {
    const fs::path out = tmp / (std::string("run_") + mode);
    ASSERT_EQ(run_grpo("grpo_full_finetune_single_device", tmp / "cfg.yaml", out,
                       {std::string("compile=") + mode}),
              0);
    loss[m] = logged_values(out, "loss");
    reward[m] = logged_values(out, "reward");
    const std::vector<double> clip = logged_values(out, "clip_fraction");
    ASSERT_EQ(clip.size(), 3u);
    EXPECT_EQ(clip[0], 0.0) << "the first update's ratio is 1";
    // The step line counts the completion tokens trained (the prompt batches have no labels).
    for (double tps : logged_values(out, "tokens_per_second_per_gpu")) EXPECT_GT(tps, 0.0);
    EXPECT_TRUE(fs::exists(out / "epoch_0" / "model.safetensors"));
    ++m;
  }
  ASSERT_EQ(loss[0].size(), 3u);
  // ratio 1: each completion's loss is -its advantage, whose group mean is 0.
  EXPECT_NEAR(loss[0][0], 0.0, 1e-6);
  EXPECT_GT(logged_values(tmp / "run_false", "reward_std")[0], 0.0)
      << "the groups' rewards should differ (the test would be vacuous)";
  for (int k = 1; k < 3; ++k)
    for (size_t i = 0; i < loss[0].size(); ++i) {
      EXPECT_NEAR(loss[k][i], loss[0][i], 1e-4) << "mode " << k << " step " << i + 1;
      EXPECT_EQ(reward[k][i], reward[0][i]) << "mode " << k << " step " << i + 1;
    }
}

TEST(GrpoRecipe, NumIterationsKeepsTheRolloutAndClippingActs) {
  TempDir tmp;
  write_problems(tmp / "p.jsonl", 12);
  write_file_atomic(tmp / "cfg.yaml", grpo_yaml(tmp / "p.jsonl", false));
  const fs::path out = tmp / "run";
  ASSERT_EQ(run_grpo("grpo_full_finetune_single_device", tmp / "cfg.yaml", out,
                     {"num_iterations=3", "loss.epsilon=0.01", "optimizer.lr=5e-2"}),
            0);
  const std::vector<double> reward = logged_values(out, "reward");
  const std::vector<double> clip = logged_values(out, "clip_fraction");
  const std::vector<double> loss = logged_values(out, "loss");
  ASSERT_EQ(reward.size(), 3u);
  // One rollout for the three steps: the same completions and rewards.
  EXPECT_EQ(reward[1], reward[0]);
  EXPECT_EQ(reward[2], reward[0]);
  EXPECT_EQ(clip[0], 0.0);
  EXPECT_GT(clip[1] + clip[2], 0.0) << "the ratio should leave [0.99, 1.01] after an update";
  EXPECT_NE(loss[1], loss[0]);
}

TEST(GrpoRecipe, LoraReferenceIsTheBaseAndTheKlStartsAtZero) {
  TempDir tmp;
  write_problems(tmp / "p.jsonl", 12);
  write_file_atomic(tmp / "cfg.yaml", grpo_yaml(tmp / "p.jsonl", true));
  const fs::path out = tmp / "run";
  ASSERT_EQ(run_grpo("lora_grpo_finetune_single_device", tmp / "cfg.yaml", out,
                     {"loss._component_=GRPOSimpleLoss", "~loss.loss_type", "~loss.beta",
                      "loss.kl_coeff=0.5", "loss.epsilon=0.2"}),
            0);
  const std::vector<double> kl = logged_values(out, "kl");
  ASSERT_EQ(kl.size(), 3u);
  EXPECT_EQ(kl[0], 0.0) << "LoRA's B starts at 0: the policy is its reference";
  EXPECT_GT(kl[2], 0.0);
  EXPECT_TRUE(fs::exists(out / "epoch_0" / "adapter_model.safetensors"));
}

TEST(GrpoRecipe, ResumeAtARolloutBoundaryIsBitwiseAndMidCycleRegenerates) {
  TempDir tmp;
  write_problems(tmp / "p.jsonl", 16);
  write_file_atomic(tmp / "cfg.yaml", grpo_yaml(tmp / "p.jsonl", false));
  const std::vector<std::string> keys = {"max_steps_per_epoch=4", "num_iterations=2",
                                         "save_every_n_steps=1"};
  const fs::path ref = tmp / "ref";
  ASSERT_EQ(run_grpo("grpo_full_finetune_single_device", tmp / "cfg.yaml", ref, keys), 0);
  const std::vector<LoggedStep> want = logged_steps(ref);
  ASSERT_EQ(want.size(), 4u);
  for (const char* from : {"step_2", "step_1"}) {
    const fs::path out = tmp / (std::string("resumed_") + from);
    fs::create_directories(out);
    fs::copy(ref / from, out / from, fs::copy_options::recursive);
    std::vector<std::string> k = keys;
    k.push_back("resume_from_checkpoint=true");
    ASSERT_EQ(run_grpo("grpo_full_finetune_single_device", tmp / "cfg.yaml", out, k), 0);
    const std::vector<LoggedStep> got = logged_steps(out);
    ASSERT_FALSE(got.empty());
    EXPECT_EQ(got.back().step, 4);
    if (std::string(from) == "step_2") {  // steps 3 and 4 share a rollout made at step 3
      ASSERT_EQ(got.size(), 2u);
      for (size_t i = 0; i < 2; ++i) {
        EXPECT_EQ(got[i].loss, want[2 + i].loss) << "step " << got[i].step;
        EXPECT_EQ(got[i].grad_norm, want[2 + i].grad_norm) << "step " << got[i].step;
      }
    } else {  // step 2 reused step 1's rollout, which the resumed run does not hold
      EXPECT_EQ(got.size(), 3u);
    }
  }
}

// `fusetune plan` plans the GRPO step it runs (recipes/grpo_plan.h): the update on the
// rollout's rows (2 prompts x 4 samples, a 24-token prompt + 6 generated, padded to 32) and
// the rollout before it; its peak is within 10% of the measured one (log_peak_memory_stats,
// two steps: the second holds the optimizer state) in every mode, full and LoRA with a
// reference (the base). Full GRPO with beta != 0 plans a frozen copy of the weights.
TEST(GrpoPlan, PlansTheRolloutsRowsAndItsPeakIsTheMeasuredOne) {
  TempDir tmp;
  write_problems(tmp / "p.jsonl", 12);
  write_file_atomic(tmp / "full.yaml", grpo_yaml(tmp / "p.jsonl", false));
  write_file_atomic(tmp / "lora.yaml", grpo_yaml(tmp / "p.jsonl", true));
  const auto plan = [&](const std::string& recipe, const std::vector<std::string>& keys) {
    const bool lora = recipe[0] == 'l';
    Config cfg = load_config((tmp / (lora ? "lora.yaml" : "full.yaml")).string());
    cfg.apply_overrides(keys);
    cfg = with_defaults(cfg, lora ? lora_grpo_schema() : grpo_full_schema());
    return plan_step(cfg, recipe, model_architecture(cfg));
  };
  const std::vector<std::string> shape = {"dataset.max_seq_len=24", "max_steps_per_epoch=2",
                                          "log_peak_memory_stats=true"};
  std::vector<std::string> with_reference = shape;
  with_reference.push_back("loss.beta=0.05");
  for (const std::string recipe :
       {"grpo_full_finetune_single_device", "lora_grpo_finetune_single_device"})
    for (const char* mode : {"false", "model", "true"}) {
      SCOPED_TRACE(recipe + " compile " + mode);
      std::vector<std::string> keys = recipe[0] == 'l' ? with_reference : shape;
      keys.push_back(std::string("compile=") + mode);
      const fs::path out = tmp / (recipe + mode);
      ASSERT_EQ(run_grpo(recipe, tmp / (recipe[0] == 'l' ? "lora.yaml" : "full.yaml"), out, keys),
                0);
      const PlannedStep s = plan(recipe, keys);
      ASSERT_TRUE(s.grpo.has_value());
      EXPECT_EQ(s.options.batch_size, 8);
      EXPECT_EQ(s.options.seq_len, 32);
      EXPECT_FALSE(s.grpo->reference_copy);
      const ModePlan p = plan_step_mode(s, parse_compile_mode(mode));
      EXPECT_TRUE(std::any_of(p.passes.begin(), p.passes.end(), [](const std::string& l) {
        return l.rfind("rollout (8 rows", 0) == 0;
      })) << ::testing::PrintToString(p.passes);
      const double planned = double(run_peak_bytes(s, p));
      const double measured = double(logged_peak_bytes(out));
      std::printf("%s compile %s: measured %.0f B, planned %.0f B\n", recipe.c_str(), mode,
                  measured, planned);
      EXPECT_NEAR(planned / measured, 1.0, 0.10);
    }
  const PlannedStep alone = plan("grpo_full_finetune_single_device", shape);
  const PlannedStep copy = plan("grpo_full_finetune_single_device", with_reference);
  ASSERT_TRUE(copy.grpo && copy.grpo->reference_copy);
  EXPECT_EQ(plan_step_mode(copy, CompileMode::Full).memory.parameters,
            2 * plan_step_mode(alone, CompileMode::Full).memory.parameters);
}

TEST(GrpoRecipe, SchemaRefusesOtherObjectivesAndAcceptsItsKeys) {
  TempDir tmp;
  write_problems(tmp / "p.jsonl", 4);
  const std::string good = grpo_yaml(tmp / "p.jsonl", false);
  auto errors_of = [&](const Schema& s, const std::string& yaml) {
    std::string all;
    for (const std::string& e : check_config(Config::from_string(yaml, "x.yaml"), s).errors)
      all += e + "\n";
    return all;
  };
  EXPECT_EQ(errors_of(grpo_full_schema(), good), "");
  // cross-entropy is not GRPO's loss; GRPO's loss and prompts are not SFT's.
  std::string ce = good;
  const std::string grpo_loss = "loss:\n  _component_: GRPOLoss\n  loss_type: grpo\n  beta: 0.0\n";
  ASSERT_NE(ce.find(grpo_loss), std::string::npos);
  ce.replace(ce.find(grpo_loss), grpo_loss.size(), "loss:\n  _component_: cross_entropy\n");
  EXPECT_NE(errors_of(grpo_full_schema(), ce).find("GRPOSimpleLoss or GRPOLoss"), std::string::npos)
      << errors_of(grpo_full_schema(), ce);
  std::string no_loss = good;  // no loss section: GRPOSimpleLoss, GRPO's default
  no_loss.erase(no_loss.find(grpo_loss), grpo_loss.size());
  EXPECT_EQ(errors_of(grpo_full_schema(), no_loss), "");
  const std::string sft = tiny_config_yaml("tokenizer:\n  _component_: byte\n");
  EXPECT_EQ(errors_of(full_finetune_schema(), sft), "");
  EXPECT_NE(errors_of(full_finetune_schema(), sft + "loss:\n  _component_: GRPOSimpleLoss\n")
                .find("belongs to the GRPO recipes"),
            std::string::npos);
  EXPECT_NE(errors_of(grpo_full_schema(), good + "dataset_val:\n  _component_: gsm8k\n  source: "
                                                 "x.jsonl\n")
                .find("no validation"),
            std::string::npos);
  EXPECT_NE(errors_of(grpo_full_schema(), good + "grpo_sample: 4\n").find("grpo_samples"),
            std::string::npos);
}

// The registered GRPO recipes' schemas also check the `rewards` map (grpo_recipes.h:
// with_rewards_check): an unknown kind or key is a validation error naming the closest one.
TEST(GrpoRecipe, ValidationNamesAnUnknownRewardKindOrKey) {
  TempDir tmp;
  write_problems(tmp / "p.jsonl", 4);
  const std::string good = grpo_yaml(tmp / "p.jsonl", false);
  const std::string rewards =
      "rewards:\n  external: {command: \"awk '{print gsub(/e/, \\\"e\\\")}'\"}\n";
  ASSERT_NE(good.find(rewards), std::string::npos);
  for (const char* recipe :
       {"grpo_full_finetune_single_device", "grpo_full_finetune_distributed"}) {
    SCOPED_TRACE(recipe);
    const Schema& schema = *find_recipe(recipe).schema;
    auto errors_with = [&](const std::string& r) {
      std::string yaml = good;
      yaml.replace(yaml.find(rewards), rewards.size(), r);
      std::string all;
      for (const std::string& e : check_config(Config::from_string(yaml, "x.yaml"), schema).errors)
        all += e + "\n";
      return all;
    };
    EXPECT_EQ(errors_with("rewards:\n  target_word: {word: dog}\n"), "");
    const std::string kind = errors_with("rewards:\n  target_wrd: {word: dog}\n");
    EXPECT_NE(kind.find("did you mean 'target_word'"), std::string::npos) << kind;
    const std::string key = errors_with("rewards:\n  target_word: {wrd: dog}\n");
    EXPECT_NE(key.find("rewards.target_word.wrd"), std::string::npos) << key;
  }
}

TEST(GrpoLossConfig, TorchtunesAndTrlsLossesReadTheirKeys) {
  auto loss = [](const std::string& yaml) {
    return grpo_loss_from(Config::from_string(yaml + "temperature: 0.7\n", "t.yaml"));
  };
  for (const char* name : {"GRPOSimpleLoss", "torchtune.dev.grpo.loss.GRPOSimpleLoss"}) {
    const GrpoLoss l =
        loss(std::string("loss:\n  _component_: ") + name + "\n  kl_coeff: 0.3\n  epsilon: 0.15\n");
    EXPECT_EQ(l.type, GrpoLossType::GRPO);
    EXPECT_EQ(l.beta, 0.3);
    EXPECT_EQ(l.epsilon, 0.15);
    EXPECT_EQ(l.epsilon_high, 0.15);
    EXPECT_EQ(l.temperature, 0.7);  // scored at the sampling temperature
  }
  const GrpoLoss d = loss(
      "loss:\n  _component_: GRPOLoss\n  loss_type: dapo\n  beta: 0.04\n  epsilon: 0.2\n  "
      "epsilon_high: 0.28\n");
  EXPECT_EQ(d.type, GrpoLossType::DAPO);
  EXPECT_EQ(d.beta, 0.04);
  EXPECT_EQ(d.epsilon_high, 0.28);
  EXPECT_FALSE(loss("loss:\n  _component_: GRPOLoss\n").needs_reference());  // beta 0
  EXPECT_THROW(loss("loss:\n  _component_: DPOLoss\n"), Error);
  // No loss section: GRPOSimpleLoss with torchtune's defaults (kl_coeff 0.1, epsilon 0.1), and
  // the schema accepts it (it once read the missing section as cross_entropy and refused it).
  const GrpoLoss none = loss("");
  EXPECT_EQ(none.type, GrpoLossType::GRPO);
  EXPECT_EQ(none.beta, 0.1);
  EXPECT_EQ(none.epsilon, 0.1);
  EXPECT_TRUE(none.needs_reference());
}
