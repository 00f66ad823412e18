#pragma once
// KTO's KL reference point (Ethayarajh et al. 2024; TRL's KTOTrainer): the policy and the
// reference score each prompt of a batch followed by an *unrelated* completion, and the mean
// difference of their summed log-probs, detached and clamped at 0, estimates KL(policy ||
// reference) for the batch (recipes/dpo_step.cpp feeds it to the loss as `kto_kl`). As TRL, the
// unrelated completion is the previous row's: row r gets row r - 1's, row 0 the last row's. On
// paired data (chosen rows, then rejected rows) a prompt can meet its own pair's other answer
// when the batch holds one pair; TRL's shuffled unpaired batches have the same chance.
#include "fusetune/data/batch.h"
#include "fusetune/data/collate.h"

namespace fusetune {

// The mismatched rows of an unpacked batch `b` (shifted labels, as the model sees them): row r
// is row r's prompt (the tokens before its first trained target) then row r - 1's completion
// (its tokens from there to its last trained target), collated as `opts` pads a batch and cut
// to its max_seq_len (a row cut before its completion has no target and scores 0). A row
// with no trained target (train_on_input leaves no prompt to split off) is an error.
Batch mismatched_completions(const Batch& b, const CollateOptions& opts);

}  // namespace fusetune
