// fusetune plan [RECIPE] --config CONFIG [key=value ...]: what each compile mode would run and
// how much memory its step would hold, predicted without training.
#include <cstdio>

#include "fusetune/cli/args.h"
#include "fusetune/cli/command.h"
#include "fusetune/compile/compiler.h"
#include "fusetune/compile/plan_report.h"
#include "fusetune/config/builtin_configs.h"
#include "fusetune/losses/preference.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/peft/nf4_weight.h"
#include "fusetune/recipes/dpo_step.h"
#include "fusetune/recipes/lora_finetune_single_device.h"
#include "fusetune/recipes/recipe_inference.h"
#include "fusetune/recipes/recipe_setup.h"
#include "fusetune/recipes/registry.h"
#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune::cli {

const char* const kPlanHelp =
    "usage: fusetune plan [RECIPE] --config CONFIG [key=value | ~key ...]\n"
    "\n"
    "Without RECIPE (or --recipe NAME), the recipe is found as `fusetune validate` finds it:\n"
    "the config's \"# recipe:\" line, its `tune run RECIPE` header line, or its model builder.\n"
    "Builds the joint training step (model + loss + backward) for one batch of the config's\n"
    "shape (batch_size x max_seq_len) and prints, for compile false, model and true: the\n"
    "kernels per region, the fused groups, and the predicted peak memory (parameters,\n"
    "gradients, optimizer state, activations, workspace). Nothing is trained and no weights\n"
    "are read. A run with log_peak_memory_stats reports the measured peak to compare.\n";

int cmd_plan(const std::vector<std::string>& argv) {
  Args a = parse_args(argv, {{"config", "recipe"}, {}, true});
  constexpr const char* kUsage = "fusetune plan [RECIPE] --config CONFIG [key=value ...]";
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
  std::printf("%s\n", describe(choice).c_str());
  std::fflush(stdout);
  Config cfg = prepare_recipe_config(recipe, a, kUsage);
  const ModelConfig model = model_architecture(cfg);
  const int64_t T = configured_max_seq_len(cfg);
  FT_CHECK(T > 0, "plan needs a sequence length: set dataset.max_seq_len or tokenizer.max_seq_len");
  TrainingGraphOptions o;
  o.batch_size = cfg.i64("batch_size");
  o.seq_len = T;
  o.packed = cfg.boolean("dataset.packed", false);
  std::shared_ptr<peft::NF4Store> nf4;  // sized, never filled: no weights are read
  const bool dpo = recipe == "lora_dpo_single_device" || recipe == "full_dpo_single_device";
  if (recipe == "lora_finetune_single_device" || recipe == "lora_dpo_single_device") {
    // The adapters train; the base is frozen (NF4 with quantize_base, as the recipe runs it).
    const peft::LoraConfig lc = lora_config_from(cfg);
    if (lc.quantize_base) nf4 = peft::nf4_store_layout(model);
    o.trainable = peft::is_adapter_param;
    o.llama = peft::lora_llama_options(lc, nf4);
  }
  PreferenceLoss pref;
  if (dpo) {  // B pairs = 2B rows, chosen then rejected
    pref = preference_loss_from(cfg);
    o.batch_size *= 2;
    o.loss = preference_loss_builder(pref);
  }
  TrainingGraph tg = build_training_graph(model, o);
  std::printf(
      "recipe %s: %s model, %lld layers, vocab %lld; step of %lld x %lld tokens%s, the largest "
      "batch shape the config allows (batch_size x max_seq_len, two rows per DPO pair)\n\n",
      recipe.c_str(), model.model_type.c_str(), (long long)model.num_hidden_layers,
      (long long)model.vocab_size, (long long)o.batch_size, (long long)T,
      o.packed ? " (packed)" : "");
  std::vector<ModePlan> plans;
  // optimizer_in_bwd: each gradient is freed once its parameter is updated; the table also
  // shows the peak of the ordinary step for comparison.
  const bool in_bwd = cfg.boolean("optimizer_in_bwd", false);
  std::vector<int64_t> ordinary_peak;
  for (CompileMode mode : {CompileMode::None, CompileMode::Model, CompileMode::Full}) {
    PassOptions po;
    po.mode = mode;
    po.activation_checkpointing = cfg.boolean("enable_activation_checkpointing", false);
    plans.push_back(plan_mode(tg.graph, po, optimizer_state_ratio(cfg), in_bwd));
    if (in_bwd)
      ordinary_peak.push_back(plan_mode(tg.graph, po, optimizer_state_ratio(cfg)).memory.total());
    std::printf("%s\n", format_mode_plan(plans.back()).c_str());
  }
  if (dpo && pref.needs_reference()) {
    // The reference model's forward pass runs before the policy's step, without gradients.
    LlamaOptions ref_llama =
        recipe == "lora_dpo_single_device" ? peft::base_llama_options(nf4) : LlamaOptions{};
    Graph ref = build_sequence_log_probs_graph(model, o.batch_size, T, DType::F32, ref_llama);
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
                recipe == "full_dpo_single_device" ? "; plus a frozen copy of the parameters" : "");
  }
  std::printf("%-8s %9s %14s%s\n", "compile", "kernels", "peak",
              in_bwd ? "  optimizer_in_bwd: false" : "");
  for (size_t i = 0; i < plans.size(); ++i) {
    const ModePlan& p = plans[i];
    std::printf(
        "%-8s %9lld %14s%s%s\n", compile_mode_name(p.mode),
        (long long)(p.kernels[0] + p.kernels[1]), format_bytes(double(p.memory.total())).c_str(),
        in_bwd ? ("  " + format_bytes(double(ordinary_peak[i]))).c_str() : "",
        p.mode == parse_compile_mode(cfg.str("compile", "false")) ? "   <- this config" : "");
  }
  return 0;
}

}  // namespace fusetune::cli
