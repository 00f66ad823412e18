#pragma once
// The vocabulary models and losses are written in: `Value q = b.linear(x, wq)`. Every call adds
// one node (or a reshape around it) to the graph; nothing is computed here.
#include "fusetune/graph/graph.h"

namespace fusetune {

class Builder {
 public:
  explicit Builder(Graph& g) : g_(g) {}
  Graph& graph() { return g_; }
  const Shape& shape(Value v) const { return g_.shape(v); }

  Value matmul(Value a, Value b, bool trans_a = false, bool trans_b = false);
  // x [..., K], w [O, K] (PyTorch nn.Linear layout), optional bias [O] -> [..., O].
  Value linear(Value x, Value w, Value bias = {});
  Value add(Value a, Value b);
  Value mul(Value a, Value b);
  Value scale(Value a, double s);
  Value silu(Value a);
  Value gelu_tanh(Value a);
  Value softcap(Value a, double cap);  // cap * tanh(a / cap)
  Value rmsnorm(Value x, Value w, double eps);
  Value rope(Value x, Value cos, Value sin, Value positions, bool inverse = false);
  Value softmax(Value x);
  Value log_softmax(Value x);
  Value nll_sum(Value logp, Value labels);
  Value embedding(Value table, Value ids);
  // window > 0: a query also sees only its last `window` keys, itself included (Gemma 2).
  Value causal_mask(Value scores, Value doc_ids = {}, int64_t window = 0);
  Value repeat_heads(Value x, int64_t groups);
  Value reshape(Value x, Shape shape);
  Value transpose(Value x, int dim0, int dim1);
  Value slice(Value x, int dim, int64_t start, int64_t len);
  Value sum(Value x);

 private:
  Graph& g_;
};

}  // namespace fusetune
