#include "fusetune/recipes/step_plan.h"

#include <algorithm>
#include <filesystem>
#include <optional>

#include "fusetune/compile/compiler.h"
#include "fusetune/distributed/grad_allreduce.h"
#include "fusetune/losses/reward.h"
#include "fusetune/models/grpo_graph.h"
#include "fusetune/models/parameters.h"
#include "fusetune/peft/head_parts.h"
#include "fusetune/peft/lora.h"
#include "fusetune/quant/qat.h"
#include "fusetune/recipes/distillation_recipe.h"
#include "fusetune/recipes/dpo_step.h"
#include "fusetune/recipes/grpo_recipes.h"
#include "fusetune/recipes/kd_step.h"
#include "fusetune/recipes/kd_teacher_topk.h"
#include "fusetune/recipes/lora_finetune_single_device.h"
#include "fusetune/recipes/recipe_setup.h"
#include "fusetune/recipes/registry.h"
#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune {
namespace {

// The peak of `cfg` (after `overrides`) in its configured compile mode.
int64_t configured_peak(const Config& cfg, const std::vector<std::string>& overrides,
                        const std::string& recipe, const ModelConfig& model) {
  Config c = cfg;
  c.apply_overrides(overrides);
  const PlannedStep s = plan_step(c, recipe, model, true);
  return run_peak_bytes(s, plan_step_mode(s, s.configured_mode));
}

// The key that sets the training sequence length (configured_max_seq_len reads it first).
std::string seq_len_key(const Config& cfg) {
  return cfg.has("dataset.max_seq_len") ? "dataset.max_seq_len" : "tokenizer.max_seq_len";
}

std::string join_overrides(const std::vector<std::string>& o) { return join(o, " "); }

// The KD recipes' teacher: its weights and forward (the logits graph, or under a fused step
// the hidden-state graph, as kd_step.h runs it) added to the student's plan `p`.
void add_teacher(const PlannedStep& s, CompileMode mode, bool fused, ModePlan& p) {
  const TrainingGraphOptions& o = s.options;
  const Graph g = fused ? build_hidden_graph(*s.teacher, o.batch_size, o.seq_len, o.dtype)
                        : build_logits_graph(*s.teacher, o.batch_size, o.seq_len, o.dtype);
  const ModePlan t = plan_mode(g, step_pass_options(s, mode), 0.0);
  const int64_t forward = t.memory.activations + t.memory.workspace;
  // Its output is held through the student's step (an input there, which plan_mode does not
  // count); while the teacher runs, the student holds no gradients or activations yet.
  const int64_t handed = int64_t(g.type(g.outputs()[0].second).nbytes());
  p.memory.parameters += t.memory.parameters;
  p.memory.activations =
      std::max(p.memory.activations + handed, forward - p.memory.workspace - p.memory.gradients);
  p.passes.push_back("teacher (frozen, " + std::string(fused ? "hidden states" : "logits") +
                     " into the step): weights " + format_bytes(double(t.memory.parameters)) +
                     ", forward " + format_bytes(double(forward)));
}

bool is_distillation(const std::string& recipe) {
  return recipe.rfind("knowledge_distillation", 0) == 0;
}

}  // namespace

DType plan_dtype(const Config& cfg) { return parse_dtype(cfg.str("dtype", "fp32")); }

PlannedStep plan_step(const Config& cfg, const std::string& recipe, const ModelConfig& model,
                      bool allow_unknown_seq_len) {
  const RecipeTraits& traits = recipe_traits(recipe);
  PlannedStep s;
  s.recipe = recipe;
  s.model = model;
  int64_t T = configured_max_seq_len(cfg);
  if (T <= 0) {
    FT_CHECK(allow_unknown_seq_len,
             "plan needs a sequence length: set dataset.max_seq_len or tokenizer.max_seq_len "
             "(e.g. tokenizer.max_seq_len=2048 on the command line)");
    s.seq_len_known = false;
    T = 1;
  }
  TrainingGraphOptions& o = s.options;
  o.batch_size = cfg.i64("batch_size");
  o.seq_len = T;
  o.packed = cfg.boolean("dataset.packed", false);
  o.dtype = plan_dtype(cfg);
  // A KD student with model.lora_attn_modules trains adapters, as distillation_job runs it.
  const bool lora = traits.lora || (is_distillation(recipe) && cfg.has("model.lora_attn_modules"));
  if (lora) {
    // The adapters train; the base is frozen (NF4 with quantize_base, as the recipe runs it).
    const peft::LoraConfig lc = lora_config_from(cfg);
    if (lc.quantize_base) s.nf4 = peft::nf4_store_layout(model);
    o.trainable = peft::is_adapter_param;
    o.llama = peft::lora_llama_options(lc, s.nf4);
  }
  if (traits.qat) {
    // The fake-quantized linears (quant/qat.h), under the adapters for QAT LoRA.
    const LlamaOptions fq = quant::qat_llama_options(quant::qat_config_from(cfg),
                                                     std::make_shared<ModelConfig>(model), true);
    o.llama = traits.lora ? peft::lora_llama_options(lora_config_from(cfg), nullptr, &fq) : fq;
  }
  if (traits.dpo) {  // B pairs = 2B rows, chosen then rejected (unpaired KTO: B rows)
    s.preference = preference_loss_from(cfg);
    if (!s.preference->unpaired) o.batch_size *= 2;
    o.loss = preference_loss_builder(*s.preference);
  }
  if (traits.reward) {  // a classifier of one score on B pairs = 2B rows (reward_step.h)
    if (s.model.num_labels == 0) s.model.num_labels = 1;
    o.batch_size *= 2;
    RewardLoss loss;
    loss.center_rewards_coefficient = cfg.f64("center_rewards_coefficient", 0.0);
    o.loss = reward_loss_builder(loss);
  }
  if (is_distillation(recipe)) {  // the student's loss against the teacher (kd_step.h)
    s.teacher = model_architecture(teacher_config(cfg));
    o.loss = distillation_loss_builder(distillation_loss_from(cfg), cfg.f64("kd_ratio", 0.5));
  }
  if (is_grpo_recipe(recipe)) {  // the update on the rollout's rows (grpo_plan.h)
    s.grpo = grpo_plan_from(cfg, recipe, model, T);
    o.batch_size = s.grpo->rows;
    o.seq_len = s.grpo->seq_len;
    o.loss = grpo_loss_builder(grpo_loss_from(cfg));
  }
  if (is_ppo_recipe(recipe)) {  // the policy's update on one micro-batch (ppo_plan.h)
    s.ppo = ppo_plan_from(cfg, model, T);
    o.batch_size = cfg.i64("ppo_batch_size") / cfg.i64("gradient_accumulation_steps", 1);
    o.seq_len = s.ppo->seq_len;
    o.loss = ppo_policy_loss_builder(*s.ppo);
  }
  s.optimizer_state = optimizer_state_ratio(cfg);
  s.optimizer_in_bwd = cfg.boolean("optimizer_in_bwd", false);
  s.activation_checkpointing = cfg.boolean("enable_activation_checkpointing", false);
  s.gradient_accumulation_steps = cfg.i64("gradient_accumulation_steps", 1);
  s.reshard_after_forward = cfg.boolean("fsdp_reshard_after_forward", true);
  s.overlap_grad_allreduce = cfg.boolean("overlap_grad_allreduce", false) && !traits.dpo &&
                             !traits.reward && !s.optimizer_in_bwd;
  s.bucket_elements = cfg.has("bucket_cap_mb")
                          ? dist::bucket_elements_of_mib(cfg.f64("bucket_cap_mb"))
                          : dist::kBucketElements;
  s.configured_mode = parse_compile_mode(cfg.str("compile", "false"));
  s.graph = build_training_graph(s.model, o);
  // teacher_logits: the teacher as its top-k (recipes/kd_teacher_topk.h).
  const std::optional<TeacherLogitsOptions> topk =
      s.teacher ? teacher_logits_options(cfg, model.vocab_size) : std::nullopt;
  // A LoRA student's head hook hands the fused kernel its parts (peft/head_parts.h).
  const bool head_parts = lora && !traits.qat;
  if (s.teacher &&
      kd_fuses_heads(CompileMode::Full, o.llama, model, *s.teacher, head_parts, topk.has_value())) {
    TrainingGraphOptions f = o;
    std::shared_ptr<KdStudentHead> parts;
    if (f.llama.head) {
      parts = std::make_shared<KdStudentHead>();
      f.llama.head = peft::head_parts_hook(
          lora_config_from(cfg), [nf4 = s.nf4]() -> const peft::NF4Store* { return nf4.get(); },
          parts);
    }
    f.loss = fused_distillation_loss_builder(distillation_loss_from(cfg), cfg.f64("kd_ratio", 0.5),
                                             s.teacher->hidden_size, parts, topk ? topk->top_k : 0);
    s.fused_kd_graph = build_training_graph(model, f);
  }
  // A precomputed top-k file that is there: the run trains without loading the teacher
  // (without it, the first run loads the teacher to compute it, and the plan counts it).
  if (topk && topk->precompute && std::filesystem::exists(topk->file()) &&
      (!cfg.has("dataset_val") || std::filesystem::exists(topk->val_file())))
    s.teacher.reset();
  if (s.nf4)
    s.nf4_bound_graph = [model, o, lc = lora_config_from(cfg), nf4 = s.nf4]() {
      auto bound = std::make_shared<peft::NF4Store>(*nf4);
      peft::bind_nf4_at_run(*bound);
      TrainingGraphOptions b = o;
      b.llama = peft::lora_llama_options(lc, bound);
      return build_training_graph(model, b);
    };
  return s;
}

PassOptions step_pass_options(const PlannedStep& s, CompileMode mode) {
  PassOptions po;
  po.mode = mode;
  po.activation_checkpointing = s.activation_checkpointing;
  return po;
}

bool streams_gradients(const PlannedStep& s) {
  // PPO hands its gradients over at each update, after its micro-batches (ppo_step.h).
  return !s.preference && !recipe_traits(s.recipe).reward && !s.ppo;
}

ModePlan plan_step_mode(const PlannedStep& s, CompileMode mode, bool ordinary) {
  const bool fused = s.fused_kd_graph && mode == CompileMode::Full;
  ModePlan p =
      plan_mode(fused ? s.fused_kd_graph->graph : s.graph.graph, step_pass_options(s, mode),
                s.optimizer_state, s.optimizer_in_bwd && !ordinary);
  if (s.teacher) add_teacher(s, mode, fused, p);
  if (s.grpo) add_rollout(*s.grpo, s.model, s.options, step_pass_options(s, mode), p);
  if (s.ppo)
    add_ppo_models(*s.ppo, s.model, s.options, step_pass_options(s, mode), s.optimizer_state,
                   s.optimizer_in_bwd && !ordinary, p);
  return p;
}

int64_t run_peak_bytes(const PlannedStep& s, const ModePlan& p) {
  int64_t peak = p.memory.total();
  if (s.gradient_accumulation_steps > 1 && !s.optimizer_in_bwd) peak += p.memory.gradients;
  return peak;
}

peft::ParameterCount count_step_parameters(const PlannedStep& s) {
  peft::ParameterCount c;
  for (const ParamInfo& p : graph_parameters(s.graph.graph)) {
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    c.total += n;
    if (p.trainable) c.trainable += n;
  }
  if (s.nf4) c.total += peft::nf4_numel(*s.nf4);
  return c;
}

namespace {

// The smallest divisor of n above d (n itself at most).
int64_t ppo_next_divisor_above(int64_t n, int64_t d) {
  for (int64_t k = d + 1; k < n; ++k)
    if (n % k == 0) return k;
  return n;
}

// The largest divisor of n below d (1 at least).
int64_t ppo_next_divisor_below(int64_t n, int64_t d) {
  for (int64_t k = d - 1; k > 1; --k)
    if (n % k == 0) return k;
  return 1;
}

// The changes that save memory without changing what is trained: compile: true, then
// activation checkpointing (each only when not already set).
std::vector<FitCandidate> memory_only_fit_changes(const Config& cfg) {
  std::vector<FitCandidate> singles;
  if (parse_compile_mode(cfg.str("compile", "false")) != CompileMode::Full)
    singles.push_back({{"compile=true"}, "compile model, loss and backward as one graph", 0});
  if (!cfg.boolean("enable_activation_checkpointing", false))
    singles.push_back({{"enable_activation_checkpointing=true"},
                       "recompute layer activations in the backward",
                       0});
  return singles;
}

// PPO's levers, each keeping its rules (batch_size a multiple of ppo_batch_size and of
// forward_batch_size, ppo_batch_size of gradient_accumulation_steps; no accumulation under
// optimizer_in_bwd): the update's micro-batch smaller (more accumulation steps: the same
// updates), fewer rows per rollout forward (the
// same trajectory), then shorter responses. Its batch sizes are never changed: that would
// change what each update trains on.
FitAdvice find_fitting_ppo_settings(const Config& cfg, const std::string& recipe,
                                    const ModelConfig& model, int64_t available) {
  const int64_t batch = cfg.i64("batch_size"), ppo = cfg.i64("ppo_batch_size");
  const int64_t ga = cfg.i64("gradient_accumulation_steps", 1);
  const int64_t fwd = cfg.i64("forward_batch_size"), gen = cfg.i64("max_generated_tokens");
  std::vector<FitCandidate> singles = memory_only_fit_changes(cfg);
  std::vector<std::string> base;  // the changes that keep the training the same
  for (const FitCandidate& c : singles) base.push_back(c.overrides[0]);
  // optimizer_in_bwd needs gradient_accumulation_steps: 1 (torchtune's PPO configs set it).
  const bool accumulate = !cfg.boolean("optimizer_in_bwd", false);
  if (accumulate && ga < ppo)
    singles.push_back(
        {{"gradient_accumulation_steps=" + std::to_string(ppo_next_divisor_above(ppo, ga))},
         "smaller micro-batches of the same PPO updates",
         0});
  if (fwd > 1)
    singles.push_back({{"forward_batch_size=" + std::to_string(ppo_next_divisor_below(batch, fwd))},
                       "fewer rows per rollout forward; the same trajectory",
                       0});
  if (gen > 1)
    singles.push_back(
        {{"max_generated_tokens=" + std::to_string(gen / 2)}, "half the longest response", 0});
  FitAdvice advice;
  for (FitCandidate& c : singles) {
    c.peak = configured_peak(cfg, c.overrides, recipe, model);
    if (c.peak <= available) advice.fitting.push_back(c);
  }
  if (!advice.fitting.empty()) return advice;
  // Combined: the changes that keep the training the same, then ever smaller micro-batches
  // and rollout forwards, then shorter responses; the first combination that fits.
  int64_t g = ga, f = fwd, n = gen;
  auto fits = [&]() {
    FitCandidate c{base, "combined", 0};
    if (g != ga) c.overrides.push_back("gradient_accumulation_steps=" + std::to_string(g));
    if (f != fwd) c.overrides.push_back("forward_batch_size=" + std::to_string(f));
    if (n != gen) c.overrides.push_back("max_generated_tokens=" + std::to_string(n));
    if (c.overrides.empty()) return false;
    c.peak = configured_peak(cfg, c.overrides, recipe, model);
    if (!advice.closest || c.peak < advice.closest->peak) advice.closest = c;
    if (c.peak > available) return false;
    advice.fitting.push_back(c);
    advice.closest.reset();
    return true;
  };
  if (fits()) return advice;
  while (accumulate && g < ppo)
    if (g = ppo_next_divisor_above(ppo, g); fits()) return advice;
  while (f > 1)
    if (f = ppo_next_divisor_below(batch, f); fits()) return advice;
  while (n > 1)
    if (n /= 2; fits()) return advice;
  if (optimizer_state_ratio(cfg).min_8bit_numel == 0)
    advice.hint = "(beyond this list: optimizer: AdamW8bit; or a smaller ppo_batch_size)";
  return advice;
}

}  // namespace

FitAdvice find_fitting_settings(const Config& cfg, const std::string& recipe,
                                const ModelConfig& model, int64_t available) {
  if (is_ppo_recipe(recipe)) return find_fitting_ppo_settings(cfg, recipe, model, available);
  const RecipeTraits& traits = recipe_traits(recipe);
  // The single changes, in the documented order.
  std::vector<FitCandidate> singles = memory_only_fit_changes(cfg);
  // (The QAT recipes fake-quantize a float base: no NF4.)
  if (traits.lora && !traits.qat && !cfg.boolean("model.quantize_base", false))
    singles.push_back({{"model.quantize_base=true"}, "QLoRA: the frozen base stored as NF4", 0});
  const int64_t batch = cfg.i64("batch_size");
  if (batch > 1)
    singles.push_back({{"batch_size=" + std::to_string(batch / 2)},
                       "half the batch; raise gradient_accumulation_steps to keep the effective "
                       "batch",
                       0});
  const int64_t T = configured_max_seq_len(cfg);
  constexpr int64_t kMinSeqLen = 64;
  if (T > kMinSeqLen)
    singles.push_back({{seq_len_key(cfg) + "=" + std::to_string(std::max(kMinSeqLen, T / 2))},
                       "half the sequence length; longer samples are truncated",
                       0});
  FitAdvice advice;
  for (FitCandidate& c : singles) {
    c.peak = configured_peak(cfg, c.overrides, recipe, model);
    if (c.peak <= available) advice.fitting.push_back(c);
  }
  if (!advice.fitting.empty()) return advice;
  if (!traits.lora) {
    const bool eight_bit = optimizer_state_ratio(cfg).min_8bit_numel > 0;
    const bool in_bwd = cfg.boolean("optimizer_in_bwd", false);
    advice.hint = std::string("(beyond this list: train adapters instead, with ") +
                  "lora_finetune_single_device and model.quantize_base: true" +
                  (eight_bit ? "" : "; or optimizer: AdamW8bit") +
                  (in_bwd || traits.dpo || traits.reward ? "" : "; or optimizer_in_bwd: true") +
                  ")";
  }
  // Combined: the changes that keep the training the same first, then smaller batches, then
  // shorter sequences; the first combination that fits.
  FitCandidate combo{{}, "combined", 0};
  auto consider = [&](const FitCandidate& c) {
    if (!advice.closest || c.peak < advice.closest->peak) advice.closest = c;
    if (c.peak > available) return false;
    advice.fitting.push_back(c);
    advice.closest.reset();
    return true;
  };
  std::vector<std::string> base;
  for (const FitCandidate& c : singles) {
    const std::string& o = c.overrides[0];
    if (o.rfind("batch_size=", 0) == 0 || o.find("max_seq_len=") != std::string::npos) continue;
    base.push_back(o);
  }
  combo.overrides = base;
  if (!base.empty()) {
    combo.peak = configured_peak(cfg, combo.overrides, recipe, model);
    if (consider(combo)) return advice;
  }
  for (int64_t b = batch / 2; b >= 1; b /= 2) {
    combo.overrides = base;
    combo.overrides.push_back("batch_size=" + std::to_string(b));
    combo.peak = configured_peak(cfg, combo.overrides, recipe, model);
    if (consider(combo)) return advice;
    if (b == 1) break;
  }
  const std::vector<std::string> with_batch = combo.overrides;
  for (int64_t t = std::max(kMinSeqLen, T / 2); T > kMinSeqLen; t = std::max(kMinSeqLen, t / 2)) {
    combo.overrides = with_batch;
    combo.overrides.push_back(seq_len_key(cfg) + "=" + std::to_string(t));
    combo.peak = configured_peak(cfg, combo.overrides, recipe, model);
    if (consider(combo) || t == kMinSeqLen) return advice;
  }
  return advice;
}

std::string format_fit_advice(const FitAdvice& advice, int64_t available) {
  std::string out;
  if (!advice.fitting.empty()) {
    out += "settings that fit in " + format_bytes(double(available)) + ":\n";
    for (const FitCandidate& c : advice.fitting)
      out += "  " + join_overrides(c.overrides) + "  -> " + format_bytes(double(c.peak)) +
             (c.why == "combined" ? "" : "  (" + c.why + ")") + "\n";
  } else if (advice.closest) {
    out += "no setting tried fits in " + format_bytes(double(available)) + "; the closest:\n  " +
           join_overrides(advice.closest->overrides) + "  -> " +
           format_bytes(double(advice.closest->peak)) + "\n";
    if (!advice.hint.empty()) out += advice.hint + "\n";
  }
  return out;
}

std::string check_run_fits_memory(const Config& cfg, const std::string& recipe) {
  if (!cfg.boolean("memory_check", true)) return "";
  const std::optional<AvailableMemory> available = available_memory();
  if (!available) return "";
  ModelConfig model;
  try {
    model = model_architecture(cfg);
  } catch (const Error&) {
    return "";  // loading the model reports what is wrong with it
  }
  std::optional<PlannedStep> planned;
  int64_t peak = 0;
  try {
    planned = plan_step(cfg, recipe, model, true);
    peak = run_peak_bytes(*planned, plan_step_mode(*planned, planned->configured_mode));
  } catch (const Error&) {
    // PPO's value and reward models (not classifiers of one score, no config.json): loading
    // them reports what is wrong, naming the key.
    if (!is_ppo_recipe(recipe)) throw;
    return "";
  }
  const PlannedStep& s = *planned;
  if (peak <= available->bytes)
    return format_bytes(double(peak)) + (s.seq_len_known ? "" : " (no max_seq_len: a floor)") +
           " of " + format_bytes(double(available->bytes)) + " available (" + available->source +
           ")";
  const FitAdvice advice = find_fitting_settings(cfg, recipe, model, available->bytes);
  throw Error("this run would not fit in memory: `fusetune plan` predicts a peak of " +
              format_bytes(double(peak)) +
              " for its step (compile: " + compile_mode_name(s.configured_mode) + ", batch " +
              std::to_string(s.options.batch_size) + " x " +
              (s.seq_len_known ? std::to_string(s.options.seq_len) + " tokens"
                               : std::string("1 token: no max_seq_len, so this is a floor")) +
              ") but " + format_bytes(double(available->bytes)) + " is available (" +
              available->source + "); stopping before the model is loaded.\n" +
              format_fit_advice(advice, available->bytes) +
              "Set memory_check: false to run anyway.");
}

}  // namespace fusetune
