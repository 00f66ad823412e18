#pragma once
// Gradient-norm clipping as torch.nn.utils.clip_grad_norm_ (norm_type 2, foreach off):
//   total_norm = sqrt(sum of g^2 over every gradient element)   (accumulated in double)
//   clip_coef  = max_norm / (total_norm + 1e-6)
//   if clip_coef < 1: every gradient *= clip_coef              (in the gradient's dtype)
// The sum is taken over fixed-size blocks combined in a fixed order, so the result is
// bitwise the same for any thread count. Parameters without a gradient are skipped.
// BF16 gradients are widened exactly and summed in double like the others; clipping scales
// them in fp32 and rounds to nearest.
//
// A non-finite total norm (inf/nan gradients) is returned as is and the gradients are left
// untouched: the recipe decides what to do (report it, skip the step). torch would instead
// multiply every gradient by nan (or 0 for inf), destroying the evidence.
#include <vector>

#include "fusetune/optim/param_ref.h"

namespace fusetune {

// The L2 norm of all gradients together, without clipping.
double grad_norm(const std::vector<ParamRef>& params);

// Clips in place and returns the total norm before clipping. max_norm must be > 0.
double clip_grad_norm(const std::vector<ParamRef>& params, double max_norm);

// The pieces, for gradients spread over ranks (ZeRO-2): the sum of squares of `params`'
// gradients (grad_norm = its sqrt), and the scaling clip_grad_norm applies given the total norm
// of all the gradients (nothing when it is not finite or within max_norm).
double grad_sum_squares(const std::vector<ParamRef>& params);
void clip_to_norm(const std::vector<ParamRef>& params, double max_norm, double total_norm);

}  // namespace fusetune
