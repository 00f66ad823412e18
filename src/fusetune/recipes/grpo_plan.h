#pragma once
// `fusetune plan` for the GRPO recipes (grpo_step.h). The update trains on the rollout's rows:
// batch_size prompts x grpo_samples completions, each as long as the config allows (the longest
// prompt, max_seq_len, plus max_generated_tokens, padded as the rollout pads, within the
// model's context). Before it, the step generates on the training weights with a KV cache,
// scores the rows (the old log-probs, and the reference's when beta != 0) and holds what the
// update reads; full GRPO with beta != 0 also holds a frozen copy of the weights, and a
// `reward_model` reward its classifier.
#include <cstdint>
#include <optional>
#include <string>

#include "fusetune/compile/plan_report.h"
#include "fusetune/config/config.h"
#include "fusetune/models/training_graph.h"

namespace fusetune {

struct GrpoPlan {
  int64_t prompts = 0;          // batch_size
  int64_t rows = 0;             // prompts x grpo_samples
  int64_t prompt_len = 0;       // the longest prompt
  int64_t seq_len = 0;          // prompt + completion, padded: the update's T
  int64_t forward_rows = 0;     // rows per scoring forward (forward_batch_size, else all)
  double temperature = 1.0;     // the scoring graphs' (GrpoLoss::temperature)
  bool reference = false;       // beta != 0: a reference forward
  bool reference_copy = false;  // and its weights are a copy (full GRPO; LoRA: the base)
  // A `reward_model` reward's classifier (rewards.reward_model.checkpoint_dir's config.json):
  // its fp32 weights are held through the run, its scoring forward runs after the rollout.
  std::optional<ModelConfig> reward_model;
};

bool is_grpo_recipe(const std::string& recipe);

// The rollout of `cfg` (prepared for `recipe`) for a model with this context.
GrpoPlan grpo_plan_from(const Config& cfg, const std::string& recipe, const ModelConfig& model,
                        int64_t prompt_len);

// Adds the rollout to `p`, the plan of the update's graph in the same mode (`o`: that graph's
// options, rows and T the rollout's): the reference copy's weights; the rollout's moment
// (the KV cache with the prefill's activations, or a scoring forward, or the reward model's)
// where it exceeds the
// update's activations; and the buffers the update reads (tokens, labels, positions, old and
// reference log-probs, advantages, token weights), held through it. One line in p.passes.
void add_rollout(const GrpoPlan& g, const ModelConfig& model, const TrainingGraphOptions& o,
                 const PassOptions& po, ModePlan& p);

}  // namespace fusetune
