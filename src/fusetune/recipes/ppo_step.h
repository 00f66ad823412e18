#pragma once
// The PPO step (ppo_full_finetune_single_device; torchtune's recipe; docs/design.md §11). The
// loop's batch is batch_size prompts (any sample dataset: each sample's tokens are a prompt).
// begin_step makes the trajectory, forward_batch_size rows at a time:
//   1. a response per prompt, sampled with the KV cache on the training weights themselves
//      (grpo_rollout.h), seeded by the run's seed, the step and the prompt's dataset index; it
//      ends after its first stop token (what follows is padding);
//   2. the policy's log-probs of the responses (the forward-only scoring graph: the first
//      update's ratio is exactly 1), the frozen reference's, and the value model's values;
//   3. the reward model's score at each (prompt, response)'s last token, replaced by
//      reward_penalty where penalise_no_eos (no stop token) or min_response_length applies;
//   4. the rewards (-kl_coeff (logp - ref_logp) per token, the score added at the row's score
//      index) and GAE's advantages (whitened over the response tokens) and returns
//      (losses/ppo_advantages.h).
// run() then trains it: ppo_epochs passes over the rows in a seeded random order, in
// mini-batches of ppo_batch_size rows, each one optimizer update over gradient_accumulation_steps
// micro-batches. A micro-batch runs two compiled graphs: the policy's forward + clipped policy
// loss + backward (GRPO's graph with beta = 0) and the value model's forward + clipped value
// loss + backward (models/ppo_graph.h). The updates go through StepContext::apply_update (or
// the optimizer_in_bwd hook): the step updates itself (TrainingStep::updates_itself).
//
// The value model's parameters sit in the policy's TensorMap under `value_prefix`, so the one
// optimizer (and its checkpoint) covers both.
//
// On ranks (`comm`, ppo_full_finetune_distributed): each rank makes and trains the trajectory of
// its own prompts; what PPO takes over the batch spans every rank's rows: the whitening's
// masked mean and variance, the masked means of a micro-batch's losses (the global micro-batch:
// every rank's k-th, whose gradients the loop sums), the step line's statistics. Every rank
// shuffles its rows with the same permutation (seeded by the seed, the step and the epoch).
//
// Metrics (torchtune's names): scores, rlhf_reward (scores + the KL reward summed per row),
// kl and kl_reward (summed per row), num_stop_tokens (rows padded after a stop token),
// response_lengths (tokens, the stop token included); over the updates: policy_loss,
// value_loss, ratios, clipfrac, approx_policy_kl; gen_tokens_per_s.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fusetune/distributed/communicator.h"
#include "fusetune/generation/generator.h"
#include "fusetune/losses/ppo.h"
#include "fusetune/recipes/sft_step.h"

namespace fusetune {

using PpoUpdate = std::function<void(std::vector<std::pair<std::string, Tensor>>)>;

struct PpoStepOptions {
  ModelStepOptions policy;  // the trained policy; its params also hold the value model's
  PpoLoss loss;
  double kl_coeff = 0.01;
  double gamma = 1.0;
  double lmbda = 0.95;
  int64_t ppo_epochs = 1;
  int64_t ppo_batch_size = 1;               // rows per optimizer update
  int64_t gradient_accumulation_steps = 1;  // micro-batches per update
  int64_t forward_batch_size = 0;           // rows per rollout forward; 0: all at once
  GenerationOptions generation;             // max_new_tokens, sampling, stop tokens; seed
  std::optional<int64_t> min_response_length;
  bool penalise_no_eos = false;
  double reward_penalty = -3.0;
  const TensorMap* ref_params = nullptr;  // the frozen reference (the policy's architecture)
  const ModelConfig* value_model = nullptr;
  std::string value_prefix = "value_model.";
  const ModelConfig* reward_model = nullptr;  // frozen, num_labels 1
  const TensorMap* reward_params = nullptr;
  int32_t pad_id = 0;
  int64_t pad_to = 8;      // rollout rows are padded to a multiple of this many tokens
  PpoUpdate apply_update;  // the loop's update (unused under optimizer_in_bwd)
  // optimizer_in_bwd: the loop's hook updates each parameter during the backward. Only then
  // does the step take a gradient hook (stream_gradients): ZeRO-2's reduce-as-you-go hook
  // would skip the update's clip and optimizer, so on ranks the gradients go to apply_update.
  bool optimizer_in_bwd = false;
  dist::Communicator* comm = nullptr;  // the ranks; null: one process
};

std::unique_ptr<TrainingStep> make_ppo_step(PpoStepOptions opts);

// The response index at which row's score (and its last value) sits, for a response of
// `length` tokens (>= 1) in a width of W: torchtune's value_seq_idxs, one past the last token
// when there is room (the state after it), else the last token.
int64_t ppo_score_index(int64_t length, int64_t W);

}  // namespace fusetune
