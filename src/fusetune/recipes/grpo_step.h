#pragma once
// The GRPO step (grpo_full_finetune_single_device, lora_grpo_finetune_single_device;
// docs/design.md §11). The loop's batches are prompts (datasets/prompts.h, by dataset index).
// At the start of an optimizer step (begin_step), for each micro-batch:
//   1. the rollout: grpo_samples completions of each prompt, sampled with the KV cache on the
//      training weights themselves (grpo_rollout.h), seeded by the run's seed, the step and the
//      micro-batch;
//   2. the policy's log-probs of the completions (the forward-only scoring graph, the old
//      log-probs of the ratio, so the first update's ratio is exactly 1) and, when beta != 0,
//      the reference's (full: a frozen copy; LoRA: the same weights without the adapters);
//   3. the rewards (rewards/reward_set.h) and the group-normalized advantages.
// Then run() is the joint graph of the model, the clipped GRPO loss and the backward
// (models/grpo_graph.h), the token weights giving the loss_type's normalization over the whole
// optimizer step and all ranks (1 / loss_scale counts its micro-batches, or for dapo its
// completion tokens: loss_units).
//
// num_iterations (torchtune's ppo_epochs): each rollout trains that many optimizer steps; the
// steps in between keep it (their own batches are not generated from), so the ratio departs
// from 1 and clipping acts. A resume in the middle of such a cycle has no rollout in memory:
// it generates one from the step's batch with the resumed weights and keeps it until the
// next multiple of num_iterations; a resume at a multiple continues bitwise as the
// uninterrupted run.
//
// Metrics: reward (mean), reward_std (mean over groups of their standard deviation),
// rewards/<kind>, kl (mean k3 over completion tokens, when beta != 0), clip_fraction (tokens
// where the clipped term is taken), completion_length (tokens), stopped (share ending on a
// stop token), gen_tokens_per_s (the rollouts' generated tokens over their generation time).
#include <memory>

#include "fusetune/generation/generator.h"
#include "fusetune/losses/grpo.h"
#include "fusetune/recipes/sft_step.h"
#include "fusetune/rewards/reward_set.h"
#include "fusetune/tokenizers/tokenizer.h"

namespace fusetune {

namespace datasets {
class PromptDataset;
}

struct GrpoStepOptions {
  ModelStepOptions policy;  // the trained model (its params, hooks, passes)
  GrpoLoss loss;
  bool scale_rewards = true;
  int64_t samples = 4;             // grpo_samples: completions per prompt
  int64_t num_iterations = 1;      // optimizer steps per rollout
  int64_t forward_batch_size = 0;  // rows per scoring forward; 0: all rows at once
  GenerationOptions generation;    // max_new_tokens, sampling, stop tokens; seed: the run's
  // The reference (beta != 0): full GRPO's frozen copy, or LoRA's own params read through
  // hooks without the adapters.
  const TensorMap* ref_params = nullptr;
  LlamaOptions ref_llama;
  const datasets::PromptDataset* prompts = nullptr;
  const Tokenizer* tokenizer = nullptr;  // decodes completions for the rewards
  std::shared_ptr<const RewardSet> rewards;
  int64_t pad_to = 8;  // rollout rows are padded to a multiple of this many tokens
};

std::unique_ptr<TrainingStep> make_grpo_step(GrpoStepOptions opts);

}  // namespace fusetune
