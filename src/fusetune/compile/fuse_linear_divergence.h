#pragma once
// Knowledge distillation under `compile: true` (docs/design.md §3): the KD step's graph holds
// FusedLinearDivergence (both LM heads, CE and the divergence, chunked) and, from its VJP, a
// FusedLinearDivergenceBackward over the same inputs that recomputes both chunks of logits.
// The loss is linear in the forward's two sums, so their gradient dy does not depend on the
// forward: this pass replaces the pair by one FusedLinearDivergenceBackward at the forward's
// place, which yields the sums, dh and dW in one sweep (two head GEMMs per chunk fewer).
// Needs the loss region, so it does nothing under `compile: model`; returns "" when the graph
// has no FusedLinearDivergence.
#include "fusetune/compile/pass.h"

namespace fusetune::passes::fuse_linear_divergence {
std::string run(Graph& g, const PassOptions& opts);
}
