#pragma once
// Pass: the LM head, log_softmax and the label gather of the preference losses
// (MatMul/NF4MatMul -> LogSoftmax -> LabelLogProbs, and a RowSum of the logits for the
// logits/* metrics) become one chunked FusedLinearLogProbs; their backward (LabelLogProbs
// Backward -> LogSoftmaxBackward -> the head's dh/dW matmuls) becomes one
// FusedLinearLogProbsBackward that recomputes each chunk's logits from the saved logsumexp
// (a frozen head instead keeps E_p[W] [N, D] from the forward: its backward has no GEMM).
// The [tokens x vocab] logits, log-probs and their gradients then never exist. Forward-only
// graphs (the reference model's pass) get the forward op alone. Loss region: compile: true only.
#include <string>

#include "fusetune/compile/pass.h"

namespace fusetune::passes::fuse_linear_log_probs {

std::string run(Graph& g, const PassOptions& opts);

}  // namespace fusetune::passes::fuse_linear_log_probs
