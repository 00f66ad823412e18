#pragma once
// GRPO's rollout (docs/design.md §11): `samples` completions per prompt generated with the
// KV-cache generator on the training weights (the Generator's TensorMap shares the
// parameters' storage: no second copy), and the training micro-batch they make.
#include <cstdint>
#include <vector>

#include "fusetune/data/batch.h"
#include "fusetune/generation/generator.h"

namespace fusetune {

struct GrpoRollout {
  std::vector<std::vector<int32_t>> prompts;      // per row: each prompt `samples` times
  std::vector<std::vector<int32_t>> completions;  // per row, a final stop token kept
  std::vector<bool> stopped;                      // per row: ended on a stop token
  // Per row, the log-prob of each completion token under softmax(logits / temperature) (1 when
  // greedy; before top-k/top-p filtering), recorded as the generator chose it; empty unless
  // asked for (RolloutLogps::Record): GRPO's and PPO's old log-probs come from their scoring
  // graphs, so the recipes skip this pass over the vocabulary.
  std::vector<std::vector<double>> logps;
};

enum class RolloutLogps { Skip, Record };

// Rows p * samples .. p * samples + samples - 1 are prompt p's group. With `prompt_seeds`
// (one per prompt) row (p, s) draws from its own generator seeded by both, so a prompt's
// completions do not depend on the other prompts of the batch, nor on which rank holds it;
// without, one generator seeded by o.seed draws every row. Either way the same seeds, weights
// and prompts give the same rollout, for any thread count.
GrpoRollout generate_rollout(Generator& generator, const std::vector<std::vector<int32_t>>& prompts,
                             int64_t samples, const GenerationOptions& o,
                             const std::vector<uint64_t>& prompt_seeds = {},
                             RolloutLogps logps = RolloutLogps::Skip);

// The rows as a training batch: prompt + completion from position 0, right-padded with pad_id
// to the longest row rounded up to a multiple of `pad_to`; labels (already shifted) are the
// next token where that token is a completion token, -100 elsewhere; items = the row indices.
Batch rollout_batch(const GrpoRollout& r, int32_t pad_id, int64_t pad_to);

// 1 where a label is a completion token, else 0: [rows * T].
std::vector<float> completion_mask(const Batch& b);

}  // namespace fusetune
