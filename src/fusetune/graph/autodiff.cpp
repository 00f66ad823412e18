#include "fusetune/graph/autodiff.h"

#include <map>

#include "fusetune/util/error.h"

namespace fusetune {
namespace {

struct Backward {
  Graph& g;

  Value op(Op o, std::vector<Value> in, Attrs at = {}) {
    return g.add1(o, std::move(in), std::move(at));
  }

  // Reduces a gradient of a broadcast result back to the shape of the broadcast operand.
  Value unbroadcast(Value dy, const Shape& to) {
    if (g.shape(dy) == to) return dy;
    Attrs at;
    at.shape = to;
    return op(Op::SumToShape, {dy}, at);
  }

  // Returns the gradient contribution for each input (invalid Value = none / not needed).
  std::vector<Value> vjp(const Node& n, int node_id, Value dy, const std::vector<bool>& need) {
    const auto& in = n.inputs;
    std::vector<Value> dx(in.size());
    const Attrs& a = n.attrs;
    Value y{node_id, 0};
    switch (n.op) {
      case Op::MatMul: {
        Value A = in[0], B = in[1];
        Attrs at;
        if (need[0]) {
          if (!a.trans_a) {
            at.trans_a = false;
            at.trans_b = !a.trans_b;
            dx[0] = op(Op::MatMul, {dy, B}, at);
          } else {
            at.trans_a = a.trans_b;
            at.trans_b = true;
            dx[0] = op(Op::MatMul, {B, dy}, at);
          }
        }
        if (need[1]) {
          if (!a.trans_b) {
            at.trans_a = !a.trans_a;
            at.trans_b = false;
            dx[1] = op(Op::MatMul, {A, dy}, at);
          } else {
            at.trans_a = true;
            at.trans_b = a.trans_a;
            dx[1] = op(Op::MatMul, {dy, A}, at);
          }
        }
        break;
      }
      case Op::Add:
        if (need[0]) dx[0] = dy;
        if (need[1]) dx[1] = unbroadcast(dy, g.shape(in[1]));
        break;
      case Op::Mul:
        if (need[0]) dx[0] = op(Op::Mul, {dy, in[1]});
        if (need[1]) dx[1] = unbroadcast(op(Op::Mul, {dy, in[0]}), g.shape(in[1]));
        break;
      case Op::Scale: {
        Attrs at;
        at.scalar = a.scalar;
        dx[0] = op(Op::Scale, {dy}, at);
        break;
      }
      case Op::Silu:
        dx[0] = op(Op::SiluBackward, {in[0], dy});
        break;
      case Op::SumAll: {
        Attrs at;
        at.shape = g.shape(in[0]);
        dx[0] = op(Op::Expand, {dy}, at);
        break;
      }
      case Op::Expand:
        dx[0] = op(Op::SumAll, {dy});
        break;
      case Op::SumToShape: {
        // Broadcasting back: y = sum over leading dims, so dx = dy repeated. Expressed as
        // Add(zeros, dy) with suffix broadcast.
        Value zeros = g.fill(g.shape(in[0]), 0.0);
        dx[0] = op(Op::Add, {zeros, dy});
        break;
      }
      case Op::RMSNorm: {
        Attrs at;
        at.eps = a.eps;
        auto outs = g.add(Op::RMSNormBackward, {in[0], in[1], dy}, at);
        dx[0] = outs[0];
        if (need[1]) dx[1] = outs[1];
        break;
      }
      case Op::Rope: {
        Attrs at;
        at.inverse = !a.inverse;
        dx[0] = op(Op::Rope, {dy, in[1], in[2], in[3]}, at);
        break;
      }
      case Op::Softmax:
        dx[0] = op(Op::SoftmaxBackward, {y, dy});
        break;
      case Op::LogSoftmax:
        dx[0] = op(Op::LogSoftmaxBackward, {y, dy});
        break;
      case Op::Nll: {
        Attrs at;
        at.dim0 = int(g.shape(in[0])[1]);
        dx[0] = op(Op::NllBackward, {dy, in[1]}, at);
        break;
      }
      case Op::Embedding: {
        Attrs at;
        at.dim0 = int(g.shape(in[0])[0]);
        Shape flat{g.type(in[1]).numel(), g.shape(in[0])[1]};
        Value dy2 = g.shape(dy) == flat ? dy : reshape(dy, flat);
        Value ids = g.shape(in[1]).size() == 1 ? in[1] : reshape(in[1], {flat[0]});
        dx[0] = op(Op::EmbeddingBackward, {dy2, ids}, at);
        break;
      }
      case Op::CausalMask: {
        std::vector<Value> args{dy};
        if (in.size() == 2) args.push_back(in[1]);
        dx[0] = op(Op::CausalMaskBackward, args);
        break;
      }
      case Op::RepeatHeads: {
        Attrs at;
        at.groups = a.groups;
        dx[0] = op(Op::RepeatHeadsBackward, {dy}, at);
        break;
      }
      case Op::Reshape:
        dx[0] = reshape(dy, g.shape(in[0]));
        break;
      case Op::Transpose: {
        Attrs at;
        at.dim0 = a.dim0;
        at.dim1 = a.dim1;
        dx[0] = op(Op::Transpose, {dy}, at);
        break;
      }
      case Op::Slice: {
        Attrs at = a;
        at.shape = g.shape(in[0]);
        dx[0] = op(Op::SliceBackward, {dy}, at);
        break;
      }
      case Op::Dropout:
        dx[0] = op(Op::Dropout, {dy, in[1]}, a);
        break;  // the same mask
      case Op::RowInvNorm:
        break;  // detached, as PEFT's DoRA detaches the weight norm
      case Op::NF4MatMul:
        dx[0] = op(Op::NF4MatMulBackward, {dy, in[1], in[2], in[3]}, a);
        break;
      case Op::FakeQuantize:  // the straight-through estimator: dy, masked when attrs.inverse
        dx[0] = a.inverse ? op(Op::FakeQuantizeBackward, {in[0], dy, in[1]}, a) : dy;
        break;
      case Op::FakeQuantMatMul: {
        if (need[0]) dx[0] = op(Op::FakeQuantMatMulBackward, {dy, in[1], in[2]}, a);
        if (need[1]) {  // dW = STE(dy^T x)
          Attrs at;
          at.trans_a = true;
          Value dw = op(Op::MatMul, {dy, in[0]}, at);
          dx[1] = a.inverse ? op(Op::FakeQuantizeBackward, {in[1], dw, in[2]}, a) : dw;
        }
        break;
      }
      case Op::LabelLogProbs: {
        Attrs at;
        at.dim0 = int(g.shape(in[0])[1]);
        dx[0] = op(Op::LabelLogProbsBackward, {dy, in[1]}, at);
        break;
      }
      case Op::RowSum: {
        // dx[.., j] = dy[..]: dy as a column times a row of ones.
        const Shape& xs = g.shape(in[0]);
        const int64_t C = xs.back(), rows = g.type(in[0]).numel() / C;
        Attrs at;
        Value ones = g.fill({1, C}, 1.0);
        Value d = op(Op::MatMul, {reshape(dy, {rows, 1}), ones}, at);
        dx[0] = reshape(d, xs);
        break;
      }
      case Op::LogSigmoid:
        dx[0] = op(Op::LogSigmoidBackward, {in[0], dy});
        break;
      case Op::Relu:
        dx[0] = op(Op::ReluBackward, {in[0], dy});
        break;
      default:
        throw Error(std::string("autodiff: no VJP rule for op ") + op_name(n.op));
    }
    return dx;
  }

  Value reshape(Value v, Shape s) {
    Attrs at;
    at.shape = std::move(s);
    return op(Op::Reshape, {v}, at);
  }
};

}  // namespace

std::vector<std::pair<std::string, Value>> append_backward(Graph& g, Value loss) {
  FT_CHECK(g.shape(loss).empty(),
           "append_backward: the loss must be a scalar, got " + shape_str(g.shape(loss)));
  const int n_forward = int(g.nodes().size());
  std::vector<bool> needs(n_forward, false);
  for (int i = 0; i < n_forward; ++i) {
    const Node& n = g.nodes()[i];
    if (n.op == Op::Param) {
      needs[i] = n.trainable;
      continue;
    }
    for (const Value& v : n.inputs)
      if (needs[v.node] && is_floating(g.type(v).dtype)) needs[i] = true;
  }

  std::map<int, Value> grad;  // forward node id -> gradient of its (single) output
  Backward bw{g};
  const int saved_region = g.nodes()[loss.node].region;
  g.set_region(saved_region);
  g.set_backward(true);
  grad[loss.node] = g.fill({}, 1.0);

  for (int i = loss.node; i >= 0; --i) {
    if (!needs[i] || !grad.count(i)) continue;
    const Node n = g.nodes()[i];  // copy: emitting nodes may reallocate the node vector
    if (n.op == Op::Param || n.op == Op::Input || n.op == Op::Constant) continue;
    FT_CHECK(n.outputs.size() == 1,
             std::string("autodiff: multi-output op ") + op_name(n.op) + " in the forward graph");
    g.set_region(n.region);
    g.set_layer(n.layer);
    std::vector<bool> need(n.inputs.size());
    for (size_t j = 0; j < n.inputs.size(); ++j)
      need[j] = needs[n.inputs[j].node] && is_floating(g.type(n.inputs[j]).dtype);
    std::vector<Value> dx = bw.vjp(n, i, grad[i], need);
    for (size_t j = 0; j < n.inputs.size(); ++j) {
      if (!need[j] || !dx[j].valid()) continue;
      int src = n.inputs[j].node;
      auto it = grad.find(src);
      if (it == grad.end())
        grad[src] = dx[j];
      else
        it->second = g.add1(Op::Add, {it->second, dx[j]});
    }
  }
  g.set_region(0);
  g.set_layer(-1);
  g.set_backward(false);

  std::vector<std::pair<std::string, Value>> out;
  for (int i = 0; i < n_forward; ++i) {
    const Node& n = g.nodes()[i];
    if (n.op != Op::Param || !n.trainable || !grad.count(i)) continue;
    out.push_back({n.name, grad[i]});
    g.mark_output("grad:" + n.name, grad[i]);
  }
  return out;
}

}  // namespace fusetune
