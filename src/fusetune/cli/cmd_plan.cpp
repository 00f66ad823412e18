// fusetune plan [RECIPE] --config CONFIG [key=value ...]: what each compile mode would run and
// how much memory its step would hold, predicted without training.
#include <cstdio>
#include <map>
#include <string>

#include "fusetune/cli/args.h"
#include "fusetune/cli/command.h"
#include "fusetune/compile/compiler.h"
#include "fusetune/compile/plan_report.h"
#include "fusetune/config/builtin_configs.h"
#include "fusetune/config/schema.h"
#include "fusetune/kernels/cpu/bf16_matmul.h"
#include "fusetune/losses/preference.h"
#include "fusetune/metrics/format.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/peft/lora.h"
#include "fusetune/peft/nf4_weight.h"
#include "fusetune/recipes/dpo_step.h"
#include "fusetune/recipes/lora_finetune_single_device.h"
#include "fusetune/recipes/rank_plan.h"
#include "fusetune/recipes/recipe_inference.h"
#include "fusetune/recipes/recipe_setup.h"
#include "fusetune/recipes/registry.h"
#include "fusetune/recipes/step_plan.h"
#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune::cli {

const char* const kPlanHelp =
    "usage: fusetune plan [RECIPE] --config CONFIG [--nproc_per_node N] [key=value | ~key ...]\n"
    "\n"
    "Without RECIPE (or --recipe NAME), the recipe is found as `fusetune validate` finds it:\n"
    "the config's \"# recipe:\" line, its `tune run RECIPE` header line, or its model builder.\n"
    "Builds the joint training step (model + loss + backward) for one batch of the config's\n"
    "shape (batch_size x max_seq_len) and prints, for compile false, model and true: the\n"
    "kernels per region, the fused groups, and the predicted peak memory (parameters,\n"
    "gradients, optimizer state, activations, workspace). Nothing is trained and no weights\n"
    "are read. A run with log_peak_memory_stats reports the measured peak to compare.\n"
    "\n"
    "Each mode's peak is compared with the memory this process may use (MemAvailable, or the\n"
    "memory cgroup's limit when lower; FUSETUNE_AVAILABLE_MEMORY_BYTES replaces the measurement).\n"
    "When the configured mode does not fit, it lists the settings that would (compile: true,\n"
    "activation checkpointing, QLoRA, a smaller batch_size or max_seq_len), each estimated the\n"
    "same way; `fusetune run` stops before loading such a config (memory_check: false runs it).\n"
    "\n"
    "--nproc_per_node N (a *_distributed recipe): the peak of each of N data-parallel ranks\n"
    "(batch_size per rank) for zero_stage 0-3 in the configured compile mode: rank 0's\n"
    "(the one that logs peak_memory_alloc) and the largest rank's, with the moment of the step\n"
    "it happens (forward, loss, backward, gradient all-reduce or update), the communication\n"
    "buffers and, at stage 3, the parameters gathered from other ranks then.\n";

namespace {

// The DPO recipes' reference forward: its activations and workspace in each compile mode.
void print_reference_forward(const PlannedStep& step, const ModelConfig& model, const Config& cfg,
                             const RecipeTraits& traits) {
  const TrainingGraphOptions& o = step.options;
  // The reference model's forward pass runs before the policy's step, without gradients; the
  // LoRA recipes' reference is the base model without adapters.
  LlamaOptions ref_llama = traits.lora ? peft::base_llama_options(step.nf4) : LlamaOptions{};
  Graph ref = build_sequence_log_probs_graph(model, o.batch_size, o.seq_len, o.dtype, ref_llama);
  std::printf("reference forward (%s):", cfg.boolean("precompute_ref_log_probs", false)
                                             ? "once per pair, before training"
                                             : "every step, before the policy's");
  for (CompileMode mode : {CompileMode::None, CompileMode::Model, CompileMode::Full}) {
    PassOptions po;
    po.mode = mode;
    const ModePlan p = plan_mode(ref, po, 0.0);
    std::printf(" %s %s", compile_mode_name(mode),
                format_bytes(double(p.memory.activations + p.memory.workspace)).c_str());
  }
  std::printf(" (activations + workspace%s)\n\n",
              traits.lora ? "" : "; plus a frozen copy of the parameters");
}

// The ZeRO stages this recipe refuses with this config, each with the check's error: the
// config validated with zero_stage set to it (ZeRO-3 for GRPO and PPO, which generate on
// whole parameters; ZeRO-2/3 with bf16).
std::map<int, std::string> refused_zero_stages(const Config& cfg, const std::string& recipe) {
  std::map<int, std::string> refused;
  for (int stage = 0; stage <= 3; ++stage) {
    Config c = cfg;  // copy on write
    c.set("zero_stage", YAML::Node(stage));
    const Problems p = check_config(c, *find_recipe(recipe).schema);
    if (!p.errors.empty()) refused[stage] = p.errors.front();
  }
  return refused;
}

}  // namespace

int cmd_plan(const std::vector<std::string>& argv) {
  Args a = parse_args(argv, {{"config", "recipe", "nproc_per_node"}, {}, true});
  constexpr const char* kUsage =
      "fusetune plan [RECIPE] --config CONFIG [--nproc_per_node N] [key=value ...]";
  FT_CHECK(a.positional.size() <= 1, std::string("usage: ") + kUsage);
  FT_CHECK(
      a.options.count("config"),
      std::string("missing --config CONFIG (a YAML file or a built-in config); usage: ") + kUsage);
  FT_CHECK(a.positional.empty() || a.option("recipe").empty(),
           "give the recipe once: as RECIPE or as --recipe");
  Config raw = load_config(a.option("config"));
  raw.apply_overrides(a.overrides);
  const RecipeChoice choice =
      infer_recipe(a.positional.empty() ? a.option("recipe") : a.positional[0],
                   config_text(a.option("config")), raw, a.option("config"));
  const std::string recipe = chosen_recipe(choice).name;
  FT_CHECK(recipe != "generate" && recipe != "eval",
           "plan predicts a training step; " + recipe +
               " trains nothing (its KV cache and activations are small: generate prints the "
               "cache size when it runs)");
  const int nproc = nproc_per_node(a);
  if (nproc) check_distributed_recipe(recipe, "plans");
  std::printf("%s\n", describe(choice).c_str());
  std::fflush(stdout);
  Config cfg = prepare_recipe_config(recipe, a, kUsage);
  const ModelConfig model = model_architecture(cfg);
  const PlannedStep step = plan_step(cfg, recipe, model);
  const TrainingGraphOptions& o = step.options;
  const int64_t T = o.seq_len;
  const peft::ParameterCount params = count_step_parameters(step);
  std::printf(
      "recipe %s: %s model, %lld layers, vocab %lld; step of %lld x %lld tokens%s, the largest "
      "batch shape the config allows (batch_size x max_seq_len, two rows per DPO pair; GRPO: "
      "grpo_samples rows per prompt, max_generated_tokens after it)\n",
      recipe.c_str(), model.model_type.c_str(), (long long)model.num_hidden_layers,
      (long long)model.vocab_size, (long long)o.batch_size, (long long)T,
      o.packed ? " (packed)" : "");
  std::printf(
      "parameters: %s (%lld), trainable %s (%s%%)%s\n", short_count(params.total).c_str(),
      (long long)params.total, short_count(params.trainable).c_str(),
      format_fixed(params.total > 0 ? 100.0 * double(params.trainable) / double(params.total) : 0.0,
                   2)
          .c_str(),
      step.nf4 ? " (the NF4 base counted by its logical size)" : "");
  if (o.dtype == DType::BF16)
    std::printf("bf16 matmuls: %s\n", kernels::bf16_matmul_description().c_str());
  std::printf("\n");
  std::vector<ModePlan> plans;
  // optimizer_in_bwd: each gradient is freed once its parameter is updated; the table also
  // shows the peak of the ordinary step for comparison.
  const bool in_bwd = step.optimizer_in_bwd;
  std::vector<int64_t> ordinary_peak;
  for (CompileMode mode : {CompileMode::None, CompileMode::Model, CompileMode::Full}) {
    plans.push_back(plan_step_mode(step, mode));
    if (in_bwd) ordinary_peak.push_back(plan_step_mode(step, mode, true).memory.total());
    std::printf("%s\n", format_mode_plan(plans.back()).c_str());
  }
  if (step.preference && step.preference->needs_reference())
    print_reference_forward(step, model, cfg, recipe_traits(recipe));
  const bool accumulating = step.gradient_accumulation_steps > 1 && !in_bwd;
  if (accumulating)
    std::printf(
        "gradient_accumulation_steps: %lld holds the summed gradients across micro-batches "
        "(+%s while the next micro-batch's are computed): counted in the fit column\n\n",
        (long long)step.gradient_accumulation_steps,
        format_bytes(double(plans.back().memory.gradients)).c_str());
  const CompileMode configured = step.configured_mode;
  const ModePlan& mine = plans[configured == CompileMode::None    ? 0
                               : configured == CompileMode::Model ? 1
                                                                  : 2];
  if (nproc)
    std::printf("%s\n",
                format_rank_plans(step, mine, nproc, refused_zero_stages(cfg, recipe)).c_str());
  // The verdict: this machine's available memory against each mode's peak.
  const std::optional<AvailableMemory> available = available_memory();
  const std::string fit_header =
      available ? "fits in " + format_bytes(double(available->bytes)) + "?" : "fits?";
  std::printf("%-8s %9s %14s%s  %s\n", "compile", "kernels", "peak",
              in_bwd ? "  optimizer_in_bwd: false" : "", fit_header.c_str());
  for (size_t i = 0; i < plans.size(); ++i) {
    const ModePlan& p = plans[i];
    const int64_t peak = run_peak_bytes(step, p);
    std::string verdict = !available ? "unknown" : peak <= available->bytes ? "yes" : "no";
    if (accumulating) verdict += " (" + format_bytes(double(peak)) + " with accumulation)";
    std::printf("%-8s %9lld %14s%s  %-5s%s\n", compile_mode_name(p.mode),
                (long long)(p.kernels[0] + p.kernels[1]),
                format_bytes(double(p.memory.total())).c_str(),
                in_bwd ? ("  " + format_bytes(double(ordinary_peak[i]))).c_str() : "",
                verdict.c_str(), p.mode == configured ? "   <- this config" : "");
  }
  if (!available) {
    std::printf("\nthe available memory could not be read (/proc/meminfo)\n");
    return 0;
  }
  const int64_t peak = run_peak_bytes(step, mine);
  std::printf("\navailable memory: %s (%s)\n", format_bytes(double(available->bytes)).c_str(),
              available->source.c_str());
  if (peak <= available->bytes) {
    std::printf("this config (compile: %s) fits: %s of %s\n", compile_mode_name(configured),
                format_bytes(double(peak)).c_str(), format_bytes(double(available->bytes)).c_str());
    return 0;
  }
  std::printf(
      "this config (compile: %s) does NOT fit: %s needed, %s available; `fusetune run` "
      "would stop before loading the model (memory_check: false overrides)\n",
      compile_mode_name(configured), format_bytes(double(peak)).c_str(),
      format_bytes(double(available->bytes)).c_str());
  std::printf("%s", format_fit_advice(find_fitting_settings(cfg, recipe, model, available->bytes),
                                      available->bytes)
                        .c_str());
  return 0;
}

}  // namespace fusetune::cli
