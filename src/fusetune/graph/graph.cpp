#include "fusetune/graph/graph.h"

#include "fusetune/util/error.h"

namespace fusetune {

Value Graph::input(const std::string& name, Shape shape, DType dtype) {
  Node n;
  n.op = Op::Input;
  n.name = name;
  n.outputs = {TensorType{std::move(shape), dtype}};
  n.region = region_;
  n.layer = layer_;
  n.backward = backward_;
  nodes_.push_back(std::move(n));
  return {int(nodes_.size()) - 1, 0};
}

Value Graph::param(const std::string& name, Shape shape, bool trainable) {
  Node n;
  n.op = Op::Param;
  n.name = name;
  n.trainable = trainable;
  n.outputs = {TensorType{std::move(shape), float_dtype_}};
  n.region = region_;
  n.layer = layer_;
  n.backward = backward_;
  nodes_.push_back(std::move(n));
  return {int(nodes_.size()) - 1, 0};
}

Value Graph::constant(Tensor t, const std::string& name) {
  FT_CHECK(t.dtype() == float_dtype_ || t.dtype() == compute_dtype() || t.dtype() == DType::I32,
           "constant '" + name + "' has dtype " + dtype_name(t.dtype()));
  Node n;
  n.op = Op::Constant;
  n.name = name;
  n.outputs = {TensorType{t.shape(), t.dtype()}};
  n.constant = std::move(t);
  n.region = region_;
  n.layer = layer_;
  n.backward = backward_;
  nodes_.push_back(std::move(n));
  return {int(nodes_.size()) - 1, 0};
}

Value Graph::fill(Shape shape, double value) {
  Node n;
  n.op = Op::Fill;
  n.attrs.scalar = value;
  const DType dt = float_dtype_ == DType::BF16 && keeps_f32_in_bf16_graph(Op::Fill, 0, shape)
                       ? DType::F32
                       : float_dtype_;
  n.outputs = {TensorType{std::move(shape), dt}};
  n.region = region_;
  n.layer = layer_;
  n.backward = backward_;
  nodes_.push_back(std::move(n));
  return {int(nodes_.size()) - 1, 0};
}

std::vector<Value> Graph::add(Op op, std::vector<Value> inputs, Attrs attrs, std::string name) {
  for (const Value& v : inputs)
    FT_CHECK(
        v.valid() && v.node < int(nodes_.size()) && v.index < int(nodes_[v.node].outputs.size()),
        std::string("invalid input value to ") + op_name(op));
  Node n;
  n.op = op;
  n.outputs = infer_types(*this, op, inputs, attrs);
  n.inputs = std::move(inputs);
  n.attrs = std::move(attrs);
  n.name = std::move(name);
  n.region = region_;
  n.layer = layer_;
  n.backward = backward_;
  nodes_.push_back(std::move(n));
  std::vector<Value> out;
  for (int i = 0; i < int(nodes_.back().outputs.size()); ++i)
    out.push_back({int(nodes_.size()) - 1, i});
  return out;
}

}  // namespace fusetune
