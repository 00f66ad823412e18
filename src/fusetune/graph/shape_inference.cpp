// Shape and dtype inference (declared in graph.h as infer_types): the arity check and the shape
// rule of each op's description (graph/op_desc.h), then the BF16 graph's storage dtypes.
#include "fusetune/graph/graph.h"
#include "fusetune/graph/op_desc.h"

namespace fusetune {

// The rules (ops/, one description per op), with every floating output typed as the graph's
// float dtype.
std::vector<TensorType> infer_float_types(const Graph& g, Op op, const std::vector<Value>& in,
                                          const Attrs& a) {
  const ShapeCheck c{g, op, in, a, g.float_dtype()};
  if (op >= Op::kCount) c.fail("unknown op");
  const OpDesc& d = op_desc(op);
  if (!d.shape) c.fail("leaves are created with Graph::input/param/constant/fill");
  if (int(in.size()) < d.min_inputs || int(in.size()) > d.max_inputs)
    c.fail("wrong number of inputs (" + std::to_string(in.size()) + ")");
  return d.shape(c);
}

bool keeps_f32_in_bf16_graph(Op op, size_t output, const Shape& shape) {
  if (shape.empty()) return true;  // scalars: losses, sums and scales cost nothing in fp32
  const OpDesc& d = op_desc(op);
  return d.keeps_f32 && d.keeps_f32(output);
}

std::vector<TensorType> infer_types(const Graph& g, Op op, const std::vector<Value>& in,
                                    const Attrs& a) {
  std::vector<TensorType> out = infer_float_types(g, op, in, a);
  if (g.float_dtype() != DType::BF16) return out;
  // fp32 stays fp32: an op whose floating inputs are all fp32, one of them not a scalar (the
  // preference losses' per-sequence arithmetic), has no reason to round its result. A scalar
  // alone (the loss seed expanded into a gradient) does not make a tensor fp32.
  bool f32_tensor = false, all_f32 = true;
  for (const Value& v : in)
    if (is_floating(g.type(v).dtype)) {
      all_f32 &= g.type(v).dtype == DType::F32;
      f32_tensor |= !g.type(v).shape.empty();
    }
  for (size_t k = 0; k < out.size(); ++k)
    if (out[k].dtype == DType::BF16 &&
        ((f32_tensor && all_f32) || keeps_f32_in_bf16_graph(op, k, out[k].shape)))
      out[k].dtype = DType::F32;
  return out;
}

}  // namespace fusetune
