#pragma once
// `fusetune plan` for ppo_full_finetune_single_device (ppo_step.h). The planned graph is the
// policy's update on one micro-batch (ppo_batch_size / gradient_accumulation_steps rows, each as
// long as the config allows: the longest prompt plus max_generated_tokens, padded as the rollout
// pads). Beside it: the value model's update on the same rows (its weights, gradients and
// optimizer state; its intermediates share the step's arena with the policy's), the frozen
// reference and reward weights, and the trajectory's moment (the KV cache with the prefill's
// activations, or the largest forward over forward_batch_size rows).
#include <cstdint>
#include <string>

#include "fusetune/compile/plan_report.h"
#include "fusetune/config/config.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/optim/state_size.h"

namespace fusetune {

struct PpoPlan {
  ModelConfig value, reward;  // their checkpoints' config.json
  int64_t prompts = 0;        // batch_size
  int64_t forward_rows = 0;   // forward_batch_size
  int64_t prompt_len = 0;     // the longest prompt
  int64_t seq_len = 0;        // prompt + response, padded: every graph's T
  double temperature = 1.0;   // the log-probs' (the sampling temperature; 1 when greedy)
  double value_clip_range = 0.2, value_coeff = 0.1, epsilon = 0.1;
};

bool is_ppo_recipe(const std::string& recipe);

// The trajectory of `cfg` for a policy with this context; reads the value and reward models'
// config.json.
PpoPlan ppo_plan_from(const Config& cfg, const ModelConfig& policy, int64_t prompt_len);

// The policy update's TrainingGraphOptions loss.
LossBuilder ppo_policy_loss_builder(const PpoPlan& g);

// Adds to `p` (the plan of the policy's update graph `o` in the same mode) the value model's
// update, the frozen models' weights and the trajectory's moment. One line in p.passes.
void add_ppo_models(const PpoPlan& g, const ModelConfig& policy, const TrainingGraphOptions& o,
                    const PassOptions& po, const OptimizerStateSize& state, bool optimizer_in_bwd,
                    ModePlan& p);

}  // namespace fusetune
