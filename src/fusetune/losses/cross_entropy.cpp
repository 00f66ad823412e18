#include "fusetune/losses/cross_entropy.h"

namespace fusetune {

Value build_cross_entropy(Builder& b, Value hidden, Value head, Value labels, Value scale) {
  Graph& g = b.graph();
  g.set_region(0);
  Value logits = b.matmul(hidden, head, false, true);  // [N, V]
  g.set_region(1);
  Value logp = b.log_softmax(logits);
  Value loss = b.mul(b.nll_sum(logp, labels), scale);
  g.set_region(0);
  return loss;
}

Value build_cross_entropy_from_logits(Builder& b, Value logits, Value labels, Value scale) {
  Graph& g = b.graph();
  g.set_region(1);
  Value loss = b.mul(b.nll_sum(b.log_softmax(logits), labels), scale);
  g.set_region(0);
  return loss;
}

}  // namespace fusetune
