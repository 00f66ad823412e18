#pragma once
// Pass: the LM head, log_softmax and the label gather of the preference losses
// (MatMul/NF4MatMul -> LogSoftmax -> LabelLogProbs, and a RowSum of the logits for the
// logits/* metrics) become one chunked FusedLinearLogProbs; their backward (LabelLogProbs
// Backward -> LogSoftmaxBackward -> the head's dh/dW matmuls) becomes one
// FusedLinearLogProbsBackward that recomputes each chunk's logits from the saved logsumexp
// (a frozen head instead keeps E_p[W] [N, D] from the forward: its backward has no GEMM).
// The [tokens x vocab] logits, log-probs and their gradients then never exist beyond one
// chunk. When every row fits one chunk (a dense, uncapped head that trains, fp32/fp64), that
// chunk's logits are the forward's fourth output, held over the loss's per-token nodes, and the
// backward takes them instead of recomputing them: two GEMMs instead of three, bitwise the
// same (attrs.keep_logits; a PPO/GRPO update at L3-micro's 128K vocabulary). Forward-only
// graphs (the reference model's pass) get the forward op alone. Loss region: compile: true only.
#include <string>

#include "fusetune/compile/pass.h"

namespace fusetune::passes::fuse_linear_log_probs {

std::string run(Graph& g, const PassOptions& opts);

}  // namespace fusetune::passes::fuse_linear_log_probs
