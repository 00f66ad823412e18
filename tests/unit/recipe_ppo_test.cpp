// ppo_full_finetune_single_device without assets (recipes/ppo_recipe.h, ppo_step.h): the tiny
// Llama checkpoint as policy and reference, classifiers made from it as value and reward
// models, the byte tokenizer, prompts written here. The first (single) update's ratio is
// exactly 1, the three compile modes agree, resume continues bitwise, a hand-made reward model
// (its score is how close the last token is to one token) is raised by training, and bad inputs
// are named; the per-rank plan of the distributed recipe counts the four models.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <sstream>

#include "checks.h"
#include "fusetune/cli/command.h"
#include "fusetune/compile/compiler.h"
#include "fusetune/config/builtin_configs.h"
#include "fusetune/config/recipe_schemas.h"
#include "fusetune/config/schema.h"
#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/recipes/rank_plan.h"
#include "fusetune/recipes/recipe_setup.h"
#include "fusetune/recipes/step_plan.h"
#include "fusetune/tokenizers/load_tokenizer.h"
#include "fusetune/util/error.h"
#include "fusetune/util/fs.h"
#include "fusetune/util/system_memory.h"
#include "metrics_log.h"
#include "prepared_config.h"
#include "test_support.h"
#include "tiny_llama.h"
#include "token_reward_model.h"

using namespace fusetune;
using namespace fusetune::testing;
namespace fs = std::filesystem;

namespace {

struct PpoFiles {
  fs::path policy, value, reward, prompts;
};

PpoFiles write_ppo_files(const fs::path& dir, int32_t target) {
  PpoFiles f;
  f.policy = write_tiny_checkpoint(dir);
  f.value = write_classifier_checkpoint(f.policy, dir / "value", 5);
  f.reward = write_classifier_checkpoint(f.policy, dir / "reward", 5, 1, [target](LoadedModel& m) {
    make_token_reward(m, target, 0.5);
  });
  f.prompts = dir / "prompts.txt";
  std::string text;
  const char* starts[] = {"Once upon a time", "The cat sat", "A dog ran", "She said",
                          "It was late",      "We went",     "Then he",   "The sun"};
  for (int i = 0; i < 16; ++i)
    text += std::string(starts[i % 8]) + " " + std::to_string(i) + "\n\n";
  write_file_atomic(f.prompts, text);
  return f;
}

std::string ppo_yaml(const PpoFiles& f) {
  std::ostringstream s;
  s << "output_dir: /tmp/unused\n"
    << "policy_model:\n  _component_: torchtune.models.llama2.llama2\n  num_layers: 2\n"
    << "  embed_dim: 32\n  vocab_size: 259\n"
    << "reward_and_value_model:\n  _component_: torchtune.models.llama2.llama2_classifier\n"
    << "  num_classes: 1\n  num_layers: 2\n"
    << "checkpointer:\n  checkpoint_dir: " << f.policy.string() << "\n  model_type: LLAMA2\n"
    << "ref_policy_checkpointer:\n  checkpoint_dir: " << f.policy.string() << "\n"
    << "value_checkpointer:\n  checkpoint_dir: " << f.value.string() << "\n  model_type: REWARD\n"
    << "reward_checkpointer:\n  checkpoint_dir: " << f.reward.string() << "\n  model_type: REWARD\n"
    << "tokenizer:\n  _component_: byte\n  max_seq_len: 10\n"
    << "dataset:\n  _component_: text_completion\n  source: " << f.prompts.string()
    << "\n  add_eos: false\n"
    << "seed: 3\nshuffle: true\nbatch_size: 4\nnum_steps: 12\n"
    << "ppo_epochs: 1\nppo_batch_size: 4\ngradient_accumulation_steps: 1\nforward_batch_size: 2\n"
    << "max_generated_tokens: 4\ntemperature: 1.0\nkl_coeff: 0.05\ngamma: 1.0\nlmbda: 0.95\n"
    << "loss:\n  _component_: torchtune.rlhf.loss.PPOLoss\n  epsilon: 0.2\n  value_coeff: 0.1\n"
    << "  value_clip_range: 0.2\n"
    << "optimizer:\n  _component_: AdamW\n  lr: 1e-3\n  weight_decay: 0.0\n"
    << "compile: false\nnum_threads: 1\nlog_every_n_steps: 1\nlog_peak_memory_stats: false\n";
  return s.str();
}

int run_ppo(const fs::path& cfg, const fs::path& out, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"ppo_full_finetune_single_device", "--config", cfg.string(),
                                   "output_dir=" + out.string()};
  for (auto& e : extra) args.push_back(e);
  return cli::cmd_run(args);
}

int32_t ppo_byte_id(char c) {
  return load_tokenizer("byte", "")->encode(std::string(1, c), false, false).at(0);
}

}  // namespace

// One update per trajectory (ppo_batch_size = batch_size, one epoch): the ratio is exactly 1,
// nothing is clipped and the approximate KL is 0, in every compile mode; the modes agree. The
// rollout's forwards take as many rows as the update (forward_batch_size = ppo_batch_size): the
// scoring and training graphs then compute each row's log-probs in the same order.
TEST(PpoRecipe, FirstUpdatesRatioIsOneAndCompileModesAgree) {
  TempDir tmp;
  const PpoFiles f = write_ppo_files(tmp.path(), ppo_byte_id('e'));
  write_file_atomic(tmp / "cfg.yaml", ppo_yaml(f));
  std::vector<double> loss[3], scores[3], value_loss[3];
  int m = 0;
  for (const char* mode : {"false", "model", "true"}) {
    const fs::path out = tmp / (std::string("run_") + mode);
    ASSERT_EQ(
        run_ppo(tmp / "cfg.yaml", out, {std::string("compile=") + mode, "forward_batch_size=4"}),
        0);
    loss[m] = logged_values(out, "loss");
    scores[m] = logged_values(out, "scores");
    value_loss[m] = logged_values(out, "value_loss");
    ASSERT_EQ(loss[m].size(), 3u) << "num_steps 12 // batch_size 4";
    for (double r : logged_values(out, "ratios")) EXPECT_EQ(r, 1.0) << mode;
    for (double c : logged_values(out, "clipfrac")) EXPECT_EQ(c, 0.0) << mode;
    for (double k : logged_values(out, "approx_policy_kl")) EXPECT_EQ(k, 0.0) << mode;
    for (const char* key :
         {"rlhf_reward", "kl", "kl_reward", "num_stop_tokens", "response_lengths", "policy_loss"})
      EXPECT_EQ(logged_values(out, key).size(), 3u) << key;
    EXPECT_TRUE(fs::exists(out / "epoch_0" / "model.safetensors"));
    EXPECT_TRUE(fs::exists(out / "epoch_0" / "value" / "model.safetensors"));
    ++m;
  }
  EXPECT_GT(value_loss[0][0], 0.0);
  for (int k = 1; k < 3; ++k)
    for (size_t i = 0; i < loss[0].size(); ++i) {
      EXPECT_NEAR(loss[k][i], loss[0][i], 1e-4 * std::max(1.0, std::abs(loss[0][i])))
          << "mode " << k << " step " << i + 1;
      EXPECT_NEAR(scores[k][i], scores[0][i], 1e-4) << "mode " << k << " step " << i + 1;
    }
  // The saved value model is a classifier of one score that loads back.
  HFCheckpoint v = load_hf_checkpoint(tmp / "run_true" / "epoch_0" / "value");
  EXPECT_EQ(v.config.num_labels, 1);
}

// Several updates per trajectory (two epochs of two mini-batches, two micro-batches each):
// from the second update on the ratio departs from 1. A checkpoint per step; resuming from
// step 1 gives steps 2 and 3 bitwise.
TEST(PpoRecipe, ResumeContinuesBitwise) {
  TempDir tmp;
  const PpoFiles f = write_ppo_files(tmp.path(), ppo_byte_id('e'));
  write_file_atomic(tmp / "cfg.yaml", ppo_yaml(f));
  const std::vector<std::string> keys = {"ppo_epochs=2", "ppo_batch_size=2",
                                         "gradient_accumulation_steps=2", "save_every_n_steps=1",
                                         "optimizer.lr=1e-2"};
  const fs::path ref = tmp / "ref";
  ASSERT_EQ(run_ppo(tmp / "cfg.yaml", ref, keys), 0);
  const std::vector<LoggedStep> want = logged_steps(ref);
  ASSERT_EQ(want.size(), 3u);
  for (double r : logged_values(ref, "ratios")) EXPECT_NE(r, 1.0);
  const fs::path out = tmp / "resumed";
  fs::create_directories(out);
  fs::copy(ref / "step_1", out / "step_1", fs::copy_options::recursive);
  std::vector<std::string> k = keys;
  k.push_back("resume_from_checkpoint=true");
  ASSERT_EQ(run_ppo(tmp / "cfg.yaml", out, k), 0);
  const std::vector<LoggedStep> got = logged_steps(out);
  ASSERT_EQ(got.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(got[i].step, want[1 + i].step);
    EXPECT_EQ(got[i].loss, want[1 + i].loss) << "step " << got[i].step;
  }
  EXPECT_EQ(logged_values(out, "scores").back(), logged_values(ref, "scores").back());
}

// optimizer_in_bwd (torchtune's PPO configs set it): each parameter of the policy and the
// value model is updated as its gradient is ready, mini-batch after mini-batch; the run is the
// one whose updates the loop applies after each mini-batch.
TEST(PpoRecipe, OptimizerInBackwardUpdatesBothModelsAsTheLoopDoes) {
  TempDir tmp;
  const PpoFiles f = write_ppo_files(tmp.path(), ppo_byte_id('e'));
  write_file_atomic(tmp / "cfg.yaml", ppo_yaml(f));
  const std::vector<std::string> keys = {"ppo_epochs=2", "ppo_batch_size=2", "optimizer.lr=1e-2"};
  std::vector<double> loss[2], value_loss[2];
  for (int bwd = 0; bwd < 2; ++bwd) {
    const fs::path out = tmp / ("run" + std::to_string(bwd));
    std::vector<std::string> k = keys;
    k.push_back(bwd ? "optimizer_in_bwd=true" : "optimizer_in_bwd=false");
    ASSERT_EQ(run_ppo(tmp / "cfg.yaml", out, k), 0);
    loss[bwd] = logged_values(out, "loss");
    value_loss[bwd] = logged_values(out, "value_loss");
  }
  ASSERT_EQ(loss[0].size(), 3u);
  for (size_t i = 0; i < loss[0].size(); ++i) {
    EXPECT_NEAR(loss[1][i], loss[0][i], 1e-5) << "step " << i + 1;
    EXPECT_NEAR(value_loss[1][i], value_loss[0][i], 1e-5) << "step " << i + 1;
  }
  EXPECT_NE(value_loss[0][2], value_loss[0][0]) << "the value model should train";
}

// The trajectory's truncation and penalties: every token a stop token ends each response after
// its first token (padded after it); min_response_length and penalise_no_eos replace the score
// by reward_penalty, each only where it applies.
TEST(PpoRecipe, StopTokensTruncateAndPenaltiesReplaceTheScore) {
  TempDir tmp;
  const PpoFiles f = write_ppo_files(tmp.path(), ppo_byte_id('e'));
  write_file_atomic(tmp / "cfg.yaml", ppo_yaml(f));
  std::string all = "[";
  for (int i = 0; i < 259; ++i) all += (i ? "," : "") + std::to_string(i);
  all += "]";
  auto run = [&](const std::string& name, std::vector<std::string> keys) {
    keys.push_back("num_steps=4");
    keys.push_back("reward_penalty=-2.5");
    EXPECT_EQ(run_ppo(tmp / "cfg.yaml", tmp / name, keys), 0);
    return tmp / name;
  };
  const fs::path stopped = run("stopped", {"stop_token_ids=" + all, "penalise_no_eos=true"});
  EXPECT_EQ(logged_values(stopped, "response_lengths"), std::vector<double>{1.0});
  EXPECT_EQ(logged_values(stopped, "num_stop_tokens"), std::vector<double>{4.0});
  EXPECT_NE(logged_values(stopped, "scores")[0], -2.5) << "a stopped response is not penalised";
  const fs::path short_ = run("short", {"stop_token_ids=" + all, "min_response_length=2"});
  EXPECT_EQ(logged_values(short_, "scores"), std::vector<double>{-2.5});
  // Greedy responses that never reach the stop token (the pad id) are penalised.
  const fs::path no_eos =
      run("no_eos", {"stop_token_ids=[258]", "penalise_no_eos=true", "temperature=0"});
  EXPECT_EQ(logged_values(no_eos, "response_lengths"), std::vector<double>{4.0});
  EXPECT_EQ(logged_values(no_eos, "num_stop_tokens"), std::vector<double>{0.0});
  EXPECT_EQ(logged_values(no_eos, "scores"), std::vector<double>{-2.5});
}

// The reward model scores how close each response's last token is to 'e': PPO raises the
// mean score over a few dozen steps, well beyond the spread of the first steps.
TEST(PpoRecipe, RaisesTheRewardModelsScore) {
  TempDir tmp;
  const PpoFiles f = write_ppo_files(tmp.path(), ppo_byte_id('e'));
  write_file_atomic(tmp / "cfg.yaml", ppo_yaml(f));
  const fs::path out = tmp / "run";
  ASSERT_EQ(run_ppo(tmp / "cfg.yaml", out,
                    {"num_steps=320", "batch_size=8", "ppo_batch_size=4", "forward_batch_size=8",
                     "ppo_epochs=2", "max_generated_tokens=2", "optimizer.lr=1e-2", "kl_coeff=0.01",
                     "compile=true"}),
            0);
  const std::vector<double> s = logged_values(out, "scores");
  ASSERT_EQ(s.size(), 40u);
  double first = 0, last = 0, lo = 1e9, hi = -1e9;
  for (size_t i = 0; i < 5; ++i) {
    first += s[i] / 5;
    last += s[s.size() - 1 - i] / 5;
    lo = std::min(lo, s[i]);
    hi = std::max(hi, s[i]);
  }
  std::printf("PPO scores: first 5 steps %.3f (%.3f .. %.3f), last 5 %.3f\n", first, lo, hi, last);
  EXPECT_GT(last - first, 2 * (hi - lo))
      << "the score should rise well beyond the first steps' spread";
}

TEST(PpoRecipe, BadInputsAreNamed) {
  TempDir tmp;
  const PpoFiles f = write_ppo_files(tmp.path(), ppo_byte_id('e'));
  write_file_atomic(tmp / "cfg.yaml", ppo_yaml(f));
  const fs::path labels2 = write_classifier_checkpoint(f.policy, tmp / "two_labels", 5, 2);
  auto run_error = [&](std::vector<std::string> keys) {
    keys.insert(keys.begin(), "output_dir=" + (tmp / "bad").string());
    keys.insert(keys.begin(),
                {"ppo_full_finetune_single_device", "--config", (tmp / "cfg.yaml").string()});
    return error_of([&] { cli::cmd_run(keys); });
  };
  // A value or reward checkpointer missing: the schema names it.
  Config cfg = load_config((tmp / "cfg.yaml").string());
  cfg.remove("value_checkpointer");
  const std::string missing = error_of([&] { validate(cfg, ppo_schema()); });
  EXPECT_TRUE(contains(missing, "value_checkpointer")) << missing;
  cfg = load_config((tmp / "cfg.yaml").string());
  cfg.remove("reward_checkpointer");
  const std::string no_reward = error_of([&] { validate(cfg, ppo_schema()); });
  EXPECT_TRUE(contains(no_reward, "reward_checkpointer")) << no_reward;
  // A reward model that is a causal LM, a value model of two labels.
  std::string e = run_error({"reward_checkpointer.checkpoint_dir=" + f.policy.string()});
  EXPECT_TRUE(contains(e, "reward_checkpointer.checkpoint_dir") && contains(e, "causal LM")) << e;
  e = run_error({"value_checkpointer.checkpoint_dir=" + labels2.string()});
  EXPECT_TRUE(contains(e, "value_checkpointer.checkpoint_dir") && contains(e, "2 labels")) << e;
  // A builder key that disagrees with the checkpoint.
  e = run_error({"policy_model.num_layers=22"});
  EXPECT_TRUE(contains(e, "policy_model.num_layers") && contains(e, "has 2")) << e;
  // Batch sizes that do not divide.
  e = run_error({"ppo_batch_size=3"});
  EXPECT_TRUE(contains(e, "ppo_batch_size (3)")) << e;
  // Keys torchtune's recipe reads that fusetune cannot honour are refused by name.
  auto schema_errors = [&](const std::string& extra) {
    std::string all;
    const Config c = Config::from_string(ppo_yaml(f) + extra, "ppo.yaml");
    for (const std::string& err : check_config(c, ppo_schema()).errors) all += err + "\n";
    return all;
  };
  EXPECT_EQ(schema_errors(""), "");
  EXPECT_TRUE(contains(schema_errors("whiten_rewards: true\n"), "whiten_rewards")) << "whiten";
  EXPECT_TRUE(contains(schema_errors("model:\n  init: checkpoint\n"), "model"));
  std::string dropout = ppo_yaml(f);
  dropout.replace(dropout.find("  num_classes: 1\n"), 0, "  attn_dropout: 0.1\n");
  std::string all;
  for (const std::string& err :
       check_config(Config::from_string(dropout, "ppo.yaml"), ppo_schema()).errors)
    all += err;
  EXPECT_TRUE(contains(all, "attn_dropout")) << all;
  // The prompts: text_completion's add_eos (torchtune's key) is read: false leaves no EOS.
  for (bool eos : {false, true}) {
    Config c = load_config((tmp / "cfg.yaml").string());
    c.apply_overrides(
        {std::string("dataset.add_eos=") + (eos ? "true" : "false"), "tokenizer.max_seq_len=100"});
    auto tok = build_tokenizer(c);
    ModelConfig mc;
    auto ds = build_dataset_from_config(c, *tok, mc);
    const std::vector<int32_t>& t = ds->get(0).tokens;
    EXPECT_EQ(t.back() == tok->eos_id(), eos) << "add_eos " << eos;
  }
}

// `fusetune plan` plans the PPO step (recipes/ppo_plan.h): the policy's update on one
// micro-batch (4 rows of a 10-token prompt + 4 generated, padded to 16), the value model's
// update beside it, the reference and reward weights and the trajectory; its peak is within 2%
// of the measured one (log_peak_memory_stats, two steps: the second holds the optimizer state)
// in the compiled modes, 10% eagerly.
TEST(PpoPlan, PlansTheFourModelsAndItsPeakIsTheMeasuredOne) {
  TempDir tmp;
  const PpoFiles f = write_ppo_files(tmp.path(), ppo_byte_id('e'));
  write_file_atomic(tmp / "cfg.yaml", ppo_yaml(f));
  for (const char* mode : {"false", "model", "true"}) {
    SCOPED_TRACE(std::string("compile ") + mode);
    const std::vector<std::string> keys = {"num_steps=8", "log_peak_memory_stats=true",
                                           std::string("compile=") + mode};
    const fs::path out = tmp / (std::string("run_") + mode);
    ASSERT_EQ(run_ppo(tmp / "cfg.yaml", out, keys), 0);
    Config cfg = load_config((tmp / "cfg.yaml").string());
    cfg.apply_overrides(keys);
    cfg = with_defaults(cfg, ppo_schema());
    const PlannedStep s =
        plan_step(cfg, "ppo_full_finetune_single_device", model_architecture(cfg));
    ASSERT_TRUE(s.ppo.has_value());
    EXPECT_EQ(s.options.batch_size, 4);
    EXPECT_EQ(s.options.seq_len, 16);
    const ModePlan p = plan_step_mode(s, parse_compile_mode(mode));
    EXPECT_TRUE(std::any_of(p.passes.begin(), p.passes.end(), [](const std::string& l) {
      return l.rfind("PPO: value model update", 0) == 0;
    })) << ::testing::PrintToString(p.passes);
    const double planned = double(run_peak_bytes(s, p));
    const double measured = double(logged_peak_bytes(out));
    std::printf("PPO compile %s: measured %.0f B, planned %.0f B\n", mode, measured, planned);
    // Eager holds what a compiled plan frees early: its estimate is an upper bound (+7% here).
    EXPECT_NEAR(planned / measured, 1.0, std::string(mode) == "false" ? 0.10 : 0.02);
  }
}

namespace {

// FUSETUNE_AVAILABLE_MEMORY_BYTES for one scope.
struct PpoFakeAvailableMemory {
  explicit PpoFakeAvailableMemory(int64_t bytes) {
    ::setenv(kAvailableMemoryEnv, std::to_string(bytes).c_str(), 1);
  }
  ~PpoFakeAvailableMemory() { ::unsetenv(kAvailableMemoryEnv); }
};

// The planned peak of the config at `path` with `overrides`, after validating it as `fusetune
// run` does (a refused setting throws) and checking PPO's batch-size rules on what it reads.
int64_t ppo_validated_peak(const fs::path& path, const std::vector<std::string>& overrides) {
  const std::string recipe = "ppo_full_finetune_single_device";
  const Config cfg = prepared_config(recipe, path.string(), overrides);
  const int64_t batch = cfg.i64("batch_size"), ppo = cfg.i64("ppo_batch_size");
  EXPECT_EQ(batch % ppo, 0) << ::testing::PrintToString(overrides);
  EXPECT_EQ(batch % cfg.i64("forward_batch_size"), 0) << ::testing::PrintToString(overrides);
  EXPECT_EQ(ppo % cfg.i64("gradient_accumulation_steps"), 0) << ::testing::PrintToString(overrides);
  const PlannedStep s = plan_step(cfg, recipe, model_architecture(cfg));
  return run_peak_bytes(s, plan_step_mode(s, s.configured_mode));
}

}  // namespace

// PPO checks its memory before loading, and the fit advice keeps PPO's rules: more
// accumulation steps only where they divide ppo_batch_size, forward_batch_size only a divisor
// of batch_size, and never another batch_size or ppo_batch_size. Every suggestion validates and
// plans to the peak it was offered with; a run that does not fit stops before loading.
TEST(PpoPlan, FitAdviceValidatesAndTheRunStopsBeforeLoading) {
  TempDir tmp;
  const PpoFiles f = write_ppo_files(tmp.path(), ppo_byte_id('e'));
  const fs::path path = tmp / "cfg.yaml";
  // ppo_batch_size 6 of batch_size 12: accumulation steps 2, 3, 6; forward_batch_size 6 -> 4.
  std::string yaml = ppo_yaml(f);
  yaml.replace(yaml.find("batch_size: 4\n"), 14, "batch_size: 12\n");
  yaml.replace(yaml.find("ppo_batch_size: 4\n"), 18, "ppo_batch_size: 6\n");
  yaml.replace(yaml.find("forward_batch_size: 2\n"), 22, "forward_batch_size: 6\n");
  write_file_atomic(path, yaml);
  const std::string recipe = "ppo_full_finetune_single_device";
  const Config cfg = prepared_config(recipe, path.string(), {});
  const ModelConfig model = model_architecture(cfg);
  const int64_t peak = ppo_validated_peak(path, {});
  // Just under the config's peak: single changes fit.
  const FitAdvice some = find_fitting_settings(cfg, recipe, model, peak - 1);
  ASSERT_FALSE(some.fitting.empty());
  bool accumulation = false;
  for (const FitCandidate& c : some.fitting) {
    EXPECT_EQ(ppo_validated_peak(path, c.overrides), c.peak);
    EXPECT_LT(c.peak, peak);
    for (const std::string& o : c.overrides) {
      EXPECT_EQ(o.rfind("batch_size=", 0), std::string::npos) << o;
      EXPECT_EQ(o.rfind("ppo_batch_size=", 0), std::string::npos) << o;
      accumulation |= o == "gradient_accumulation_steps=2";
    }
  }
  EXPECT_TRUE(accumulation) << "a smaller micro-batch of the same updates";
  // Everything together (the search's last combination) fits in its own peak; with no memory
  // the smallest combination tried is named. Both validate.
  const std::vector<std::string> all = {"compile=true", "enable_activation_checkpointing=true",
                                        "gradient_accumulation_steps=6", "forward_batch_size=1",
                                        "max_generated_tokens=1"};
  const int64_t floor = ppo_validated_peak(path, all);
  const FitAdvice combined = find_fitting_settings(cfg, recipe, model, floor);
  ASSERT_EQ(combined.fitting.size(), 1u);
  EXPECT_EQ(ppo_validated_peak(path, combined.fitting[0].overrides), combined.fitting[0].peak);
  const FitAdvice none = find_fitting_settings(cfg, recipe, model, 1);
  EXPECT_TRUE(none.fitting.empty());
  ASSERT_TRUE(none.closest.has_value());
  EXPECT_LE(none.closest->peak, floor);
  EXPECT_EQ(ppo_validated_peak(path, none.closest->overrides), none.closest->peak);
  // optimizer_in_bwd (torchtune's PPO configs) needs gradient_accumulation_steps: 1: never
  // suggested there.
  const Config in_bwd = prepared_config(recipe, path.string(), {"optimizer_in_bwd=true"});
  for (const FitCandidate& c : find_fitting_settings(in_bwd, recipe, model, peak - 1).fitting)
    for (const std::string& o : c.overrides)
      EXPECT_EQ(o.rfind("gradient_accumulation_steps=", 0), std::string::npos) << o;
  // The run: stopped before anything is loaded or written, with the advice.
  PpoFakeAvailableMemory fake(peak - 1);
  const std::string e = error_of([&] {
    cli::cmd_run({recipe, "--config", path.string(), "output_dir=" + (tmp / "run").string()});
  });
  EXPECT_TRUE(contains(e, "this run would not fit in memory")) << e;
  EXPECT_TRUE(contains(e, "gradient_accumulation_steps=2")) << e;
  EXPECT_FALSE(fs::exists(tmp / "run"));
  // Batch sizes that do not divide are refused by validation already.
  for (const char* bad : {"forward_batch_size=5", "gradient_accumulation_steps=4"}) {
    const std::string v = error_of([&] { prepared_config(recipe, path.string(), {bad}); });
    EXPECT_TRUE(contains(v, std::string(bad).substr(0, std::string(bad).find('=')))) << v;
  }
}

// `fusetune plan ppo_full_finetune_distributed --nproc_per_node 2` (recipes/rank_plan.h): each
// rank holds what the single-device plan holds (the policy, its reference, the value and reward
// models, the trajectory), the optimizer-state shards of ZeRO-1 add up to the state of both
// trained models (the value model's is partitioned with the policy's), and the table offers
// only the stages the recipe accepts (not ZeRO-3, which PPO refuses).
TEST(PpoPlan, PerRankPlanCountsTheFourModelsAndListsOnlyAcceptedStages) {
  TempDir tmp;
  const PpoFiles f = write_ppo_files(tmp.path(), ppo_byte_id('e'));
  const fs::path path = tmp / "cfg.yaml";
  write_file_atomic(path, ppo_yaml(f));
  const std::vector<std::string> keys = {"gradient_accumulation_steps=2"};
  const auto planned = [&](const std::string& recipe) {
    const Config cfg = prepared_config(recipe, path.string(), keys);
    return plan_step(cfg, recipe, model_architecture(cfg));
  };
  const PlannedStep single = planned("ppo_full_finetune_single_device");
  const ModePlan one = plan_step_mode(single, single.configured_mode);
  const PlannedStep s = planned("ppo_full_finetune_distributed");
  const ModePlan p = plan_step_mode(s, s.configured_mode);
  EXPECT_EQ(p.memory.parameters, one.memory.parameters);  // the four models' weights
  // One rank at stage 0 is the single-device run.
  EXPECT_GE(plan_rank_peak(s, p, 1, 0, 0).bytes, run_peak_bytes(single, one));
  for (int stage : {0, 1, 2}) {
    int64_t state = 0;
    for (int r = 0; r < 2; ++r) {
      const RankPeak peak = plan_rank_peak(s, p, 2, r, stage);
      state += peak.optimizer_state;
      EXPECT_GE(peak.bytes, one.memory.parameters + peak.optimizer_state + one.memory.activations)
          << "stage " << stage << " rank " << r;
      // PPO's step holds every gradient of policy and value between its micro-batches.
      EXPECT_GE(peak.bytes, one.memory.parameters + peak.optimizer_state + 2 * one.memory.gradients)
          << "stage " << stage << " rank " << r;
    }
    EXPECT_EQ(state, stage == 0 ? 2 * one.memory.optimizer_state : one.memory.optimizer_state)
        << "stage " << stage;
  }
  ::testing::internal::CaptureStdout();
  const int rc =
      cli::cmd_plan({"ppo_full_finetune_distributed", "--config", path.string(), "--nproc_per_node",
                     "2", "output_dir=" + (tmp / "o").string(), keys[0]});
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(rc, 0) << out;
  // batch_size counts prompts, as the config says it (the planned step is a micro-batch of 2).
  EXPECT_TRUE(contains(out, "(compile: false; batch_size 4 per rank, global batch 8)")) << out;
  for (const char* row : {"\n0  ", "\n1  ", "\n2  "}) EXPECT_TRUE(contains(out, row)) << out;
  EXPECT_FALSE(contains(out, "\n3  ")) << out;
  EXPECT_FALSE(contains(out, "gathered")) << out;
  EXPECT_TRUE(contains(out,
                       "zero_stage 3 is refused: zero_stage 3 shards the parameters, and "
                       "PPO generates its responses on whole parameters"))
      << out;
}
