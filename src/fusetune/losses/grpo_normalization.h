#pragma once
// What GRPO computes on the host between scoring and the loss graph (docs/design.md §11):
// group-normalized advantages, and per-token weights that give each loss_type its
// normalization inside one loss graph (losses/grpo.h: loss = sum_t w_t l_t).
#include <cstdint>
#include <vector>

#include "fusetune/losses/grpo.h"

namespace fusetune {

// rewards holds consecutive groups of `group_size` completions of one prompt. Advantage =
// reward - its group's mean, divided by (the group's standard deviation + 1e-4) when
// scale_rewards (the unbiased std, as torch.std: TRL's and torchtune's). group_size >= 2.
std::vector<double> group_advantages(const std::vector<double>& rewards, int64_t group_size,
                                     bool scale_rewards);

// What the normalizations count beyond the micro-batch itself.
struct GrpoStepCounts {
  int64_t micro_batches = 1;          // in the optimizer step (gradient accumulation)
  int64_t step_tokens = 0;            // completion tokens of the whole step (dapo)
  int64_t max_completion_length = 0;  // max_generated_tokens (dr_grpo)
};

// w [rows * T] for a micro-batch whose mask [rows * T] is 1 on completion tokens, so that the
// step's loss is TRL's, averaged over the micro-batches as TRL's gradient accumulation does:
//   grpo     per row: sum_t m l / max(1, sum_t m); mean over rows   -> m / (n_r rows M)
//   bnpo     sum m l / max(1, the micro-batch's tokens)             -> m / (n M)
//   dr_grpo  sum m l / (rows max_completion_length)                 -> m / (rows L M)
//   dapo     sum m l / the step's tokens                            -> m / N_step
// (M micro-batches; torchtune's GRPOSimpleLoss normalizes as grpo.)
std::vector<float> grpo_token_weights(GrpoLossType type, const std::vector<float>& mask,
                                      int64_t rows, int64_t T, const GrpoStepCounts& counts);

}  // namespace fusetune
