#pragma once
// What the fused LM-head passes (fuse_linear_cross_entropy, fuse_linear_log_probs) both match
// in the backward: the products of the head that read the logits' gradient.
#include <optional>
#include <vector>

#include "fusetune/graph/graph.h"

namespace fusetune {

// For logits = head(h) computed by node `head` (MatMul h W^T, an NF4MatMul or a
// FakeQuantMatMul) and the node `dlogits` computing their gradient: the readers of dlogits
// must be the head's input gradient (MatMul dz W, or the NF4MatMulBackward /
// FakeQuantMatMulBackward of the same weight) and, for a dense or fake-quantized head, the
// weight gradient (MatMul dz^T h), each at most once. Either may be absent (-1). nullopt
// when dlogits has any other reader.
struct HeadBackward {
  int dh = -1, dw = -1;
};
std::optional<HeadBackward> match_head_backward(const Graph& g,
                                                const std::vector<std::vector<int>>& readers,
                                                int head, int dlogits);

}  // namespace fusetune
