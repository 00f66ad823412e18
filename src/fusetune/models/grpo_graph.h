#pragma once
// The GRPO step's graphs (docs/design.md §11), built from the same model code as every step.
//
// The training graph is build_training_graph (training_graph.h) with grpo_loss_builder: the
// model's per-token label log-probs [B*T] feed the policy loss (losses/grpo.h). Its inputs
// beside the batch: "old_logps", "advantages" (each token's sequence advantage) and
// "token_weights" [B*T] (mask and normalization, losses/grpo_normalization.h), and
// "ref_logps" [B*T] when beta != 0. It reports "token_logps", "ratio" and, with beta, "kl".
//
// The forward-only graph scores a rollout: "token_logps" [rows*T], the label log-probs of the
// policy (the rollout's old log-probs) or of the frozen reference. Both graphs compute the
// log-probs with the same ops, so under one compile mode the rollout's log-probs and the
// training graph's agree and the first update's ratio is 1. Under compile: true the head and
// log-softmax are fused in both (FusedLinearLogProbs): no [tokens x vocab] tensor.
#include "fusetune/losses/grpo.h"
#include "fusetune/models/training_graph.h"

namespace fusetune {

LossBuilder grpo_loss_builder(const GrpoLoss& loss);

// `temperature`: as GrpoLoss::temperature.
Graph build_token_log_probs_graph(const ModelConfig& cfg, int64_t rows, int64_t seq_len,
                                  DType dtype, const LlamaOptions& llama = {},
                                  double temperature = 1.0);

}  // namespace fusetune
