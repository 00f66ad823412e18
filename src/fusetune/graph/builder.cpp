#include "fusetune/graph/builder.h"

namespace fusetune {

Value Builder::matmul(Value a, Value b, bool trans_a, bool trans_b) {
  Attrs at;
  at.trans_a = trans_a;
  at.trans_b = trans_b;
  return g_.add1(Op::MatMul, {a, b}, at);
}

Value Builder::linear(Value x, Value w, Value bias) {
  Shape xs = shape(x);
  const int64_t k = xs.back();
  const int64_t rows = shape_numel(xs) / k;
  Value x2 = xs.size() == 2 ? x : reshape(x, {rows, k});
  Value y = matmul(x2, w, false, true);
  if (bias.valid()) y = add(y, bias);
  Shape out = xs;
  out.back() = shape(w)[0];
  return xs.size() == 2 ? y : reshape(y, out);
}

Value Builder::add(Value a, Value b) { return g_.add1(Op::Add, {a, b}); }
Value Builder::mul(Value a, Value b) { return g_.add1(Op::Mul, {a, b}); }

Value Builder::scale(Value a, double s) {
  Attrs at;
  at.scalar = s;
  return g_.add1(Op::Scale, {a}, at);
}

Value Builder::silu(Value a) { return g_.add1(Op::Silu, {a}); }

Value Builder::gelu_tanh(Value a) { return g_.add1(Op::GeluTanh, {a}); }

Value Builder::softcap(Value a, double cap) {
  Attrs at;
  at.scalar = cap;
  return g_.add1(Op::Softcap, {a}, at);
}

Value Builder::rmsnorm(Value x, Value w, double eps) {
  Attrs at;
  at.eps = eps;
  return g_.add1(Op::RMSNorm, {x, w}, at);
}

Value Builder::rope(Value x, Value cos, Value sin, Value positions, bool inverse) {
  Attrs at;
  at.inverse = inverse;
  return g_.add1(Op::Rope, {x, cos, sin, positions}, at);
}

Value Builder::softmax(Value x) { return g_.add1(Op::Softmax, {x}); }
Value Builder::log_softmax(Value x) { return g_.add1(Op::LogSoftmax, {x}); }
Value Builder::nll_sum(Value logp, Value labels) { return g_.add1(Op::Nll, {logp, labels}); }
Value Builder::embedding(Value table, Value ids) { return g_.add1(Op::Embedding, {table, ids}); }

Value Builder::causal_mask(Value scores, Value doc_ids, int64_t window) {
  Attrs at;
  at.window = window;
  if (doc_ids.valid()) return g_.add1(Op::CausalMask, {scores, doc_ids}, at);
  return g_.add1(Op::CausalMask, {scores}, at);
}

Value Builder::repeat_heads(Value x, int64_t groups) {
  if (groups == 1) return x;
  Attrs at;
  at.groups = groups;
  return g_.add1(Op::RepeatHeads, {x}, at);
}

Value Builder::reshape(Value x, Shape s) {
  if (shape(x) == s) return x;
  Attrs at;
  at.shape = std::move(s);
  return g_.add1(Op::Reshape, {x}, at);
}

Value Builder::transpose(Value x, int dim0, int dim1) {
  Attrs at;
  at.dim0 = dim0;
  at.dim1 = dim1;
  return g_.add1(Op::Transpose, {x}, at);
}

Value Builder::slice(Value x, int dim, int64_t start, int64_t len) {
  Attrs at;
  at.dim0 = dim;
  at.start = start;
  at.len = len;
  return g_.add1(Op::Slice, {x}, at);
}

Value Builder::sum(Value x) { return g_.add1(Op::SumAll, {x}); }

}  // namespace fusetune
