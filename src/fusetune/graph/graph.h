#pragma once
// The graph IR: a list of nodes in topological order (a node only reads values of earlier
// nodes). A node has one or more outputs; a Value names one output. Shapes and dtypes are
// inferred when a node is added, so a graph that builds is well-typed.
#include <string>
#include <vector>

#include "fusetune/core/tensor.h"
#include "fusetune/graph/op.h"

namespace fusetune {

struct Value {
  int node = -1;
  int index = 0;
  bool valid() const { return node >= 0; }
  friend bool operator==(const Value& a, const Value& b) = default;
};

struct TensorType {
  Shape shape;
  DType dtype = DType::F32;
  int64_t numel() const { return shape_numel(shape); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
};

// Op parameters; each op reads the fields it documents in op.h.
struct Attrs {
  bool trans_a = false, trans_b = false;
  bool inverse = false;
  int dim0 = 0, dim1 = 0;
  int64_t start = 0, len = 0;
  int64_t groups = 1;
  double eps = 0.0;
  double scalar = 0.0;
  Shape shape;
  int64_t chunk_rows = 0;       // FusedLinearCrossEntropy: tokens per chunk
  bool no_weight_grad = false;  // FusedLinearCrossEntropy: W is frozen (no dW output)
  bool keep_logits = false;     // FusedLinearLogProbs*: the forward hands its logits on (op.h)
  // Gemma 2's options (docs/design.md §1): keys a query sees, counting itself (CausalMask,
  // FlashAttention*, KVCacheAttention; 0 = every earlier key), and a soft-cap cap * tanh(s / cap)
  // of the attention scores or of the fused heads' logits (0 = none).
  int64_t window = 0;
  double softcap = 0.0;
  std::vector<double>
      program;  // Elementwise: encoded kernels::EwInstr list (elementwise_program.h)
};

struct Node {
  Op op = Op::Input;
  std::vector<Value> inputs;
  std::vector<TensorType> outputs;
  Attrs attrs;
  std::string name;        // inputs and params: the binding name; others: optional label
  bool trainable = false;  // params only
  Tensor constant;         // Op::Constant only
  int region = 0;          // 0 = model, 1 = loss (compile: model stops at the loss region)
  int layer = -1;          // decoder layer the node computes (forward or backward), -1 outside
  bool backward = false;   // emitted by autodiff
};

// A fused log-prob head's kept logits (FusedLinearLogProbs with attrs.keep_logits, output 3):
// one chunk's [N, V] block, read by the head's backward alone. The memory plan leaves it out of
// the arena and the executors free it after that reader, as the scratch block it replaces.
inline bool is_kept_head_logits(const Node& n, size_t output) {
  return n.op == Op::FusedLinearLogProbs && n.attrs.keep_logits && output == 3;
}

class Graph {
 public:
  explicit Graph(DType float_dtype = DType::F32) : float_dtype_(float_dtype) {}

  // The dtype parameters and activations are stored in (F32, F64 or BF16), and the one kernels
  // compute in (F32 for a BF16 graph).
  DType float_dtype() const { return float_dtype_; }
  DType compute_dtype() const { return fusetune::compute_dtype(float_dtype_); }
  const std::vector<Node>& nodes() const { return nodes_; }
  std::vector<Node>& mutable_nodes() { return nodes_; }
  const Node& node(Value v) const { return nodes_[v.node]; }
  const TensorType& type(Value v) const { return nodes_[v.node].outputs[v.index]; }
  const Shape& shape(Value v) const { return type(v).shape; }

  // Leaves.
  Value input(const std::string& name, Shape shape, DType dtype);
  Value param(const std::string& name, Shape shape, bool trainable);
  Value constant(Tensor t, const std::string& name);
  Value fill(Shape shape, double value);

  // Adds a node (shape inference runs here; a bad shape throws naming the op).
  std::vector<Value> add(Op op, std::vector<Value> inputs, Attrs attrs = {}, std::string name = {});
  Value add1(Op op, std::vector<Value> inputs, Attrs attrs = {}, std::string name = {}) {
    return add(op, std::move(inputs), std::move(attrs), std::move(name))[0];
  }

  // Named graph outputs (loss, gradients) in the order the executor returns them.
  void mark_output(const std::string& name, Value v) { outputs_.push_back({name, v}); }
  const std::vector<std::pair<std::string, Value>>& outputs() const { return outputs_; }
  std::vector<std::pair<std::string, Value>>& mutable_outputs() { return outputs_; }

  // Nodes created from now on belong to this region (0 model, 1 loss).
  void set_region(int r) { region_ = r; }
  // Nodes created from now on are tagged with this decoder layer (-1: none) and direction.
  void set_layer(int layer) { layer_ = layer; }
  void set_backward(bool b) { backward_ = b; }

 private:
  DType float_dtype_;
  std::vector<Node> nodes_;
  std::vector<std::pair<std::string, Value>> outputs_;
  int region_ = 0;
  int layer_ = -1;
  bool backward_ = false;
};

// Output types of `op` applied to inputs of the given types; throws fusetune::Error on a
// mismatch, naming the op and the shapes. In a BF16 graph the floating outputs are BF16
// except those keeps_f32_in_bf16_graph names and those of ops whose floating inputs are all
// F32 (not only scalars); ops take BF16 or F32 inputs alike.
std::vector<TensorType> infer_types(const Graph& g, Op op, const std::vector<Value>& inputs,
                                    const Attrs& attrs);

// A BF16 graph stores these outputs in fp32: scalars, and per-row statistics whose rounding
// to bf16 would cost accuracy out of proportion to their size (log-sum-exp, log-probs).
bool keeps_f32_in_bf16_graph(Op op, size_t output, const Shape& shape);

}  // namespace fusetune
