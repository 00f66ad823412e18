#pragma once
// The PPO step's value-model graphs (docs/design.md §11); the policy's are GRPO's
// (models/grpo_graph.h: the clipped term with beta = 0 is PPO's policy loss, losses/ppo.h).
//
// The value model is a sequence classifier of one score (num_labels: 1) read at every
// position: position P - 1 + k (P the prompt's length) holds the value of the state before
// response token k, where the label of that token sits (the policy's log-prob positions).
//
// The training graph is build_training_graph with ppo_value_loss_builder: inputs "old_values",
// "returns" and "value_weights" [B*T] (losses/ppo.h); it reports "value_loss" [] and "values"
// [B*T]. The forward-only graph gives the rollout's "values" [rows*T]; both compute them with the
// same ops, so in one compile mode the first update starts from the rollout's values.
#include "fusetune/losses/ppo.h"
#include "fusetune/models/training_graph.h"

namespace fusetune {

LossBuilder ppo_value_loss_builder(const PpoLoss& loss);

Graph build_token_values_graph(const ModelConfig& cfg, int64_t rows, int64_t seq_len, DType dtype);

}  // namespace fusetune
