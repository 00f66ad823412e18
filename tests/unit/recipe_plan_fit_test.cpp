// Does the step fit in this machine's memory? `fusetune plan` compares each compile mode's
// predicted peak with the available memory (faked here through FUSETUNE_AVAILABLE_MEMORY_BYTES)
// and, when the configured mode does not fit, lists settings that would, each of which fits per
// the same estimator. `fusetune run` refuses such a config before loading anything
// (memory_check: false runs it anyway). Parameters are counted whatever their storage: NF4
// base weights by their logical size. The built-in 8B and 3B configs validate and plan.
#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fusetune/cli/command.h"
#include "fusetune/config/builtin_configs.h"
#include "fusetune/config/schema.h"
#include "fusetune/models/parameters.h"
#include "fusetune/peft/parameter_count.h"
#include "fusetune/recipes/recipe_setup.h"
#include "fusetune/recipes/registry.h"
#include "fusetune/recipes/step_plan.h"
#include "fusetune/util/error.h"
#include "fusetune/util/fs.h"
#include "fusetune/util/system_memory.h"
#include "prepared_config.h"
#include "test_support.h"

using namespace fusetune;
using namespace fusetune::testing;
namespace fs = std::filesystem;

namespace {

// A dataset of one 2000-character line. (A constant, not `std::string(2000, 'a') + "\n"` at the
// call: GCC 12 at -O1 reports a false array bound in that expression in some unity batches.)
const std::string kOneLongLine = std::string(2000, 'a').append("\n");

// Sets FUSETUNE_AVAILABLE_MEMORY_BYTES for one scope.
struct FakeAvailableMemory {
  explicit FakeAvailableMemory(int64_t bytes) {
    ::setenv(kAvailableMemoryEnv, std::to_string(bytes).c_str(), 1);
  }
  ~FakeAvailableMemory() { ::unsetenv(kAvailableMemoryEnv); }
};

std::string plan_fit_lora_yaml(const fs::path& out, const fs::path& data) {
  std::ostringstream s;
  s << "output_dir: " << out.string() << "\n"
    << "model:\n  init: random\n  model_type: llama\n  vocab_size: 259\n  hidden_size: 64\n"
    << "  intermediate_size: 176\n  num_hidden_layers: 2\n  num_attention_heads: 4\n"
    << "  num_key_value_heads: 2\n  tie_word_embeddings: false\n  max_position_embeddings: 256\n"
    << "  lora_attn_modules: [q_proj, v_proj, output_proj]\n  apply_lora_to_mlp: true\n"
    << "  lora_rank: 8\n  lora_alpha: 16\n"
    << "tokenizer:\n  _component_: byte\n  max_seq_len: 256\n"
    << "dataset:\n  _component_: text_completion\n  source: " << data.string()
    << "\n  packed: true\n"
    << "seed: 42\nshuffle: true\nbatch_size: 4\nepochs: 1\nmax_steps_per_epoch: 1\n"
    << "optimizer:\n  _component_: AdamW\n  lr: 1e-3\n"
    << "compile: false\ndtype: fp32\nnum_threads: 1\nlog_every_n_steps: 1\n";
  return s.str();
}

int64_t peak_of(const Config& cfg, const std::string& recipe) {
  const PlannedStep s = plan_step(cfg, recipe, model_architecture(cfg));
  return run_peak_bytes(s, plan_step_mode(s, s.configured_mode));
}

// The verdict column of the configured mode's summary line ("yes", "no").
std::string configured_verdict(const std::string& plan) {
  std::istringstream lines(plan);
  for (std::string line; std::getline(lines, line);)
    if (line.find("<- this config") != std::string::npos) {
      std::istringstream f(line);
      std::string name, kernels, peak, unit, verdict;
      f >> name >> kernels >> peak >> unit >> verdict;
      return verdict;
    }
  return "";
}

std::string captured_plan(const std::vector<std::string>& args) {
  ::testing::internal::CaptureStdout();
  int rc = -1;
  try {
    rc = cli::cmd_plan(args);
  } catch (...) {
    ::testing::internal::GetCapturedStdout();
    throw;
  }
  std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(rc, 0) << out;
  return out;
}

// The 8B QLoRA config as a random-init model of the same shape (no checkpoint needed).
const std::vector<std::string> k8BShape = {"model.init=random",
                                           "model.model_type=llama",
                                           "model.vocab_size=128256",
                                           "model.hidden_size=4096",
                                           "model.intermediate_size=14336",
                                           "model.num_hidden_layers=32",
                                           "model.num_attention_heads=32",
                                           "model.num_key_value_heads=8",
                                           "model.max_position_embeddings=131072",
                                           "model.tie_word_embeddings=false",
                                           "dtype=fp32"};

}  // namespace

TEST(SystemMemory, ParsesMemAvailableAndHonoursTheOverride) {
  EXPECT_EQ(parse_mem_available("MemTotal:  100 kB\nMemAvailable:   2048 kB\n"), 2048 * 1024);
  EXPECT_FALSE(parse_mem_available("MemTotal: 100 kB\n").has_value());
  {
    FakeAvailableMemory fake(12345);
    const auto m = available_memory();
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->bytes, 12345);
    EXPECT_EQ(m->source, kAvailableMemoryEnv);
  }
  const auto real = available_memory();  // this machine (Linux): MemAvailable at least
  ASSERT_TRUE(real.has_value());
  EXPECT_GT(real->bytes, 0);
}

TEST(PlanFit, VerdictPerModeAndSettingsThatFitWhenTheConfigDoesNot) {
  TempDir tmp;
  write_file_atomic(tmp / "data.txt", "hello\n");
  write_file_atomic(tmp / "cfg.yaml", plan_fit_lora_yaml(tmp / "run", tmp / "data.txt"));
  const std::string recipe = "lora_finetune_single_device";
  const Config cfg = prepared_config(recipe, (tmp / "cfg.yaml").string(), {});
  const int64_t peak = peak_of(cfg, recipe);
  const std::vector<std::string> args = {recipe, "--config", (tmp / "cfg.yaml").string()};
  {
    FakeAvailableMemory fake(peak * 4);
    const std::string out = captured_plan(args);
    EXPECT_NE(out.find("this config (compile: false) fits"), std::string::npos) << out;
    EXPECT_EQ(configured_verdict(out), "yes") << out;
  }
  // Between the best single change and the config's own peak: something fits, not the config.
  const int64_t ckpt = peak_of(prepared_config(recipe, (tmp / "cfg.yaml").string(),
                                               {"enable_activation_checkpointing=true"}),
                               recipe);
  ASSERT_LT(ckpt, peak);
  const int64_t available = (ckpt + peak) / 2;
  FakeAvailableMemory fake(available);
  const std::string out = captured_plan(args);
  EXPECT_NE(out.find("this config (compile: false) does NOT fit"), std::string::npos) << out;
  EXPECT_EQ(configured_verdict(out), "no") << out;
  EXPECT_NE(out.find("settings that fit in"), std::string::npos) << out;
  EXPECT_NE(out.find("enable_activation_checkpointing=true"), std::string::npos) << out;
  // Every suggestion fits per the estimator, and each one printed is one the search returned.
  const FitAdvice advice = find_fitting_settings(cfg, recipe, model_architecture(cfg), available);
  ASSERT_FALSE(advice.fitting.empty());
  for (const FitCandidate& c : advice.fitting) {
    SCOPED_TRACE(c.overrides.front());
    const int64_t p =
        peak_of(prepared_config(recipe, (tmp / "cfg.yaml").string(), c.overrides), recipe);
    EXPECT_EQ(p, c.peak);
    EXPECT_LE(p, available);
    EXPECT_NE(out.find(c.overrides.front()), std::string::npos) << out;
  }
}

TEST(PlanFit, CombinesSettingsOrNamesTheClosestWhenNoSingleChangeFits) {
  TempDir tmp;
  write_file_atomic(tmp / "data.txt", "hello\n");
  write_file_atomic(tmp / "cfg.yaml", plan_fit_lora_yaml(tmp / "run", tmp / "data.txt"));
  const std::string recipe = "lora_finetune_single_device";
  const Config cfg = prepared_config(recipe, (tmp / "cfg.yaml").string(), {});
  const ModelConfig model = model_architecture(cfg);
  // Everything together: compile, checkpointing, QLoRA, batch 1, the shortest sequence.
  const int64_t floor = peak_of(
      prepared_config(recipe, (tmp / "cfg.yaml").string(),
                      {"compile=true", "enable_activation_checkpointing=true",
                       "model.quantize_base=true", "batch_size=1", "tokenizer.max_seq_len=64"}),
      recipe);
  const FitAdvice some = find_fitting_settings(cfg, recipe, model, floor);
  ASSERT_EQ(some.fitting.size(), 1u);
  EXPECT_LE(some.fitting[0].peak, floor);
  EXPECT_GT(some.fitting[0].overrides.size(), 1u);  // a combination
  const FitAdvice none = find_fitting_settings(cfg, recipe, model, floor / 2);
  EXPECT_TRUE(none.fitting.empty());
  ASSERT_TRUE(none.closest.has_value());
  EXPECT_EQ(none.closest->peak, floor);
  EXPECT_NE(format_fit_advice(none, floor / 2).find("no setting tried fits"), std::string::npos);
}

TEST(PlanFit, RunStopsBeforeLoadingUnlessMemoryCheckIsOff) {
  TempDir tmp;
  write_file_atomic(tmp / "data.txt", kOneLongLine);
  write_file_atomic(tmp / "cfg.yaml", plan_fit_lora_yaml(tmp / "run", tmp / "data.txt"));
  const std::string config = (tmp / "cfg.yaml").string();
  FakeAvailableMemory fake(64 << 10);  // 64 KiB: the step needs more
  // A missing dataset would fail after the model is loaded: the check comes first.
  try {
    cli::cmd_run({"lora_finetune_single_device", "--config", config,
                  "dataset.source=" + (tmp / "missing.txt").string()});
    ADD_FAILURE() << "the run did not stop";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("this run would not fit in memory"), std::string::npos) << msg;
    EXPECT_NE(msg.find("stopping before the model is loaded"), std::string::npos) << msg;
    EXPECT_NE(msg.find(kAvailableMemoryEnv), std::string::npos) << msg;
    EXPECT_NE(msg.find("memory_check: false"), std::string::npos) << msg;
  }
  EXPECT_FALSE(fs::exists(tmp / "run"));
  // The escape hatch: the same run trains.
  ::testing::internal::CaptureStdout();
  const int rc =
      cli::cmd_run({"lora_finetune_single_device", "--config", config, "memory_check=false"});
  ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(rc, 0);
  EXPECT_TRUE(fs::exists(tmp / "run" / "logs" / "metrics.jsonl"));
}

TEST(ParameterCount, NF4WeightsCountByTheirLogicalSize) {
  TempDir tmp;
  write_file_atomic(tmp / "data.txt", kOneLongLine);
  write_file_atomic(tmp / "cfg.yaml", plan_fit_lora_yaml(tmp / "run", tmp / "data.txt"));
  const std::string recipe = "lora_finetune_single_device";
  const std::string config = (tmp / "cfg.yaml").string();
  // The plan: LoRA and QLoRA count the same parameters and the same trainable ones.
  const Config lora = prepared_config(recipe, config, {});
  const Config qlora = prepared_config(recipe, config, {"model.quantize_base=true"});
  const peft::ParameterCount a =
      count_step_parameters(plan_step(lora, recipe, model_architecture(lora)));
  const PlannedStep qs = plan_step(qlora, recipe, model_architecture(qlora));
  const peft::ParameterCount b = count_step_parameters(qs);
  ASSERT_NE(qs.nf4, nullptr);
  EXPECT_EQ(a.total, b.total);
  EXPECT_EQ(a.trainable, b.trainable);
  EXPECT_LT(a.trainable, a.total / 5);
  // Quantizing parameters keeps their count.
  const ModelConfig m = model_architecture(lora);
  TensorMap params = init_parameters(
      graph_parameters(build_training_graph(m, TrainingGraphOptions{}).graph), 1, DType::F32);
  const int64_t before = peft::count_parameters(params, {}).total;
  auto store = peft::quantize_base_weights(params, m);
  EXPECT_LT(peft::count_parameters(params, {}).total, before / 2);  // the float copies are gone
  EXPECT_EQ(peft::count_parameters(params, {}, store.get()).total, before);
  // The QLoRA run's header says so too.
  FakeAvailableMemory fake(int64_t(1) << 40);
  ::testing::internal::CaptureStdout();
  const int rc = cli::cmd_run({recipe, "--config", config, "model.quantize_base=true"});
  const std::string out = ::testing::internal::GetCapturedStdout();
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find(" " + std::to_string(b.total) + " ("), std::string::npos) << out;
  EXPECT_NE(out.find("trainable " + std::to_string(b.trainable) + " ("), std::string::npos) << out;
}

TEST(BuiltinConfigs, The8BAnd3BConfigsMirrorTorchtuneAndPlan) {
  for (const char* name : {"llama3_1/8B_full_single_device", "llama3_1/8B_lora_single_device",
                           "llama3_1/8B_qlora_single_device", "llama3_2/3B_full_single_device",
                           "llama3_2/3B_lora_single_device", "llama3_2/3B_qlora_single_device"}) {
    const BuiltinConfig* b = find_builtin_config(name);
    ASSERT_NE(b, nullptr) << name;
    const Config c = load_config(name);
    EXPECT_EQ(c.str("dtype"), "bf16") << name;  // as torchtune has it
    EXPECT_TRUE(c.boolean("enable_activation_checkpointing")) << name;
  }
  EXPECT_TRUE(load_config("llama3_1/8B_qlora_single_device").boolean("model.quantize_base"));
  EXPECT_EQ(load_config("llama3_1/8B_qlora_single_device").i64("model.lora_rank"), 8);
  EXPECT_EQ(load_config("llama3_1/8B_full_single_device").str("optimizer._component_"),
            "PagedAdamW8bit");
  EXPECT_TRUE(load_config("llama3_1/8B_full_single_device").boolean("optimizer_in_bwd"));

  // The 8B QLoRA step (k8BShape plans it in fp32) counts ~8.03B parameters.
  const std::string recipe = "lora_finetune_single_device";
  std::vector<std::string> o = k8BShape;
  o.insert(o.end(), {"batch_size=1", "tokenizer.max_seq_len=512"});
  const Config cfg = prepared_config(recipe, "llama3_1/8B_qlora_single_device", o);
  EXPECT_EQ(plan_dtype(cfg), DType::F32);
  const PlannedStep s = plan_step(cfg, recipe, model_architecture(cfg));
  const peft::ParameterCount n = count_step_parameters(s);
  EXPECT_NEAR(double(n.total - n.trainable), 8.03e9, 0.01e9);  // the base
  EXPECT_LT(n.trainable, n.total / 100);
  const ModePlan p = plan_step_mode(s, CompileMode::Full);
  // The NF4 base: ~0.53 bytes per weight.
  EXPECT_GT(p.memory.parameters, int64_t(4.0e9));
  EXPECT_LT(p.memory.parameters, int64_t(5.0e9));
  EXPECT_GT(p.memory.total(), p.memory.parameters);
}

TEST(PlanDtype, Bf16IsPlannedInBf16) {
  std::vector<std::string> o = {"model.init=random",           "model.vocab_size=512",
                                "model.hidden_size=64",        "model.intermediate_size=128",
                                "model.num_hidden_layers=1",   "model.num_attention_heads=4",
                                "model.num_key_value_heads=2", "tokenizer.max_seq_len=64"};
  const Config bf16 =
      prepared_config("lora_finetune_single_device", "llama3_2/1B_qlora_single_device", o);
  EXPECT_EQ(plan_dtype(bf16), DType::BF16);
  // The unquantized parameters (norms, adapters) take half the bytes of an fp32 plan.
  o.push_back("dtype=fp32");
  const Config fp32 =
      prepared_config("lora_finetune_single_device", "llama3_2/1B_qlora_single_device", o);
  const std::string recipe = "lora_finetune_single_device";
  const ModePlan b =
      plan_step_mode(plan_step(bf16, recipe, model_architecture(bf16)), CompileMode::Full);
  const ModePlan f =
      plan_step_mode(plan_step(fp32, recipe, model_architecture(fp32)), CompileMode::Full);
  EXPECT_LT(b.memory.parameters, f.memory.parameters);
  EXPECT_LT(b.memory.total(), f.memory.total());
}
