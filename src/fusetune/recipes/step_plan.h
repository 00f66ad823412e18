#pragma once
// `fusetune plan` as a library: the training step a prepared config runs, built for one batch of
// its largest shape (nothing trained, no weight read); its predicted peak per compile mode;
// whether that fits in the memory this process may use (util/system_memory.h) and, if it does
// not, which settings would. `fusetune run` uses the same estimate to stop before loading a
// model whose step cannot fit (config key memory_check).
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fusetune/compile/plan_report.h"
#include "fusetune/config/config.h"
#include "fusetune/losses/preference.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/peft/nf4_weight.h"
#include "fusetune/peft/parameter_count.h"
#include "fusetune/recipes/grpo_plan.h"
#include "fusetune/recipes/ppo_plan.h"
#include "fusetune/util/system_memory.h"

namespace fusetune {

// The element type the plan builds the step graphs in (TrainingGraphOptions::dtype), from the
// config's `dtype`, as the run does.
DType plan_dtype(const Config& cfg);

// The step of one config, ready to plan in any compile mode.
struct PlannedStep {
  std::string recipe;
  ModelConfig model;
  TrainingGraphOptions options;              // batch_size: rows (two per DPO pair)
  std::shared_ptr<peft::NF4Store> nf4;       // LoRA with quantize_base: sized, never filled
  std::optional<PreferenceLoss> preference;  // the DPO recipes
  // knowledge_distillation_*: the frozen teacher (kd_step.h), whose weights and forward each
  // mode's plan adds (none once a precomputed teacher_logits file is there: the run does not
  // load it), and the student's graph under `compile: true` when the KD step fuses both heads
  // (fused_distillation_loss_builder; empty when it keeps the logits).
  std::optional<ModelConfig> teacher;
  std::optional<TrainingGraph> fused_kd_graph;
  // The GRPO recipes: the rollout before each update (grpo_plan.h); `options` and `graph` are
  // then the update's, on the rollout's rows.
  std::optional<GrpoPlan> grpo;
  // PPO: the value, reference and reward models and the trajectory (ppo_plan.h); `options` and
  // `graph` are the policy's update on one micro-batch.
  std::optional<PpoPlan> ppo;
  OptimizerStateSize optimizer_state;
  bool optimizer_in_bwd = false;
  bool activation_checkpointing = false;
  int64_t gradient_accumulation_steps = 1;
  bool reshard_after_forward = true;  // ZeRO-3's fsdp_reshard_after_forward (rank_plan.h)
  // overlap_grad_allreduce where the step can (not DPO, not optimizer_in_bwd): rank_plan.h.
  bool overlap_grad_allreduce = false;
  int64_t bucket_elements = 0;  // bucket_cap_mb as fp32 elements (distributed/grad_allreduce.h)
  CompileMode configured_mode = CompileMode::None;
  bool seq_len_known = true;  // false: no max_seq_len; planned at 1 token per row (a floor)
  TrainingGraph graph;
  // With an NF4 base: the graph ZeRO-3 runs, the base's packed parts bound as frozen Params
  // (peft::bind_nf4_at_run) instead of held as Constants; built on demand (zero3_rank_plan.h).
  std::function<TrainingGraph()> nf4_bound_graph;
};

// `cfg`: prepared for `recipe` (validated, defaults applied); `model`: its architecture
// (model_architecture). Without a configured max_seq_len, `allow_unknown_seq_len` plans rows of
// one token (what parameters, gradients and optimizer state need at least); otherwise that is
// an error.
PlannedStep plan_step(const Config& cfg, const std::string& recipe, const ModelConfig& model,
                      bool allow_unknown_seq_len = false);

// The compiler's options for the step in `mode` (activation checkpointing as configured).
PassOptions step_pass_options(const PlannedStep& s, CompileMode mode);
// Whether the recipe's step hands each gradient over as the backward computes it
// (TrainingStep::stream_gradients: the SFT steps; the DPO steps do not).
bool streams_gradients(const PlannedStep& s);

// The step in `mode` (activation checkpointing as configured); optimizer_in_bwd as configured
// unless `ordinary` (the ordinary step, for comparison). A KD step adds its teacher: its
// weights, and its forward's activations when they exceed the student's step (the teacher
// runs first, its output, logits or hidden states, is an input of the student's graph). A GRPO
// step adds its rollout (grpo_plan.h: add_rollout).
ModePlan plan_step_mode(const PlannedStep& s, CompileMode mode, bool ordinary = false);

// What the run holds at its peak in `mode`: the step's peak plus, with
// gradient_accumulation_steps > 1 (and no optimizer_in_bwd), the summed gradients kept across
// micro-batches (a second copy of the gradients while the next micro-batch's are computed).
int64_t run_peak_bytes(const PlannedStep& s, const ModePlan& p);

// Every parameter of the step, NF4 base weights by their logical size.
peft::ParameterCount count_step_parameters(const PlannedStep& s);

// One setting that changes the plan, as command-line overrides.
struct FitCandidate {
  std::vector<std::string> overrides;  // key=value
  std::string why;                     // what it changes, for people
  int64_t peak = 0;                    // run_peak_bytes in the config's compile mode after it
};

struct FitAdvice {
  std::vector<FitCandidate> fitting;    // single changes that fit, else the first combination
  std::optional<FitCandidate> closest;  // when nothing fits: the smallest peak tried
  std::string hint;                     // when nothing fits: what else could (full recipes)
};

// The alternatives to a config whose step does not fit in `available` bytes, each estimated with
// the same estimator (no execution), in this fixed order:
//   1. compile: true                        (when another mode is configured)
//   2. enable_activation_checkpointing: true (when off)
//   3. model.quantize_base: true             (LoRA recipes without it: QLoRA)
//   4. batch_size halved                     (when above 1)
//   5. max_seq_len halved                    (when configured and above 64)
// Each single change that fits is returned. When none does, the changes are combined in that
// order (1-3 together, then halving the batch down to 1, then the sequence down to 64) and the
// first combination that fits is returned; failing that, `closest` holds the smallest peak.
FitAdvice find_fitting_settings(const Config& cfg, const std::string& recipe,
                                const ModelConfig& model, int64_t available);

// Lines for people: the verdict and, when it does not fit, the settings that would.
std::string format_fit_advice(const FitAdvice& advice, int64_t available);

// `fusetune run`'s check, before anything is loaded: when memory_check is on (the default) and
// the available memory is known, throws fusetune::Error if the plan's peak for the configured
// compile mode exceeds it, naming the settings that would fit. Returns the verdict for the run
// header ("5.07 GiB of 22.26 GiB available (MemAvailable)"), or "" when not checked.
std::string check_run_fits_memory(const Config& cfg, const std::string& recipe);

}  // namespace fusetune
