#include "fusetune/runtime/node_kernels.h"

#include <type_traits>

#include "fusetune/graph/op_desc.h"
#include "fusetune/runtime/bf16_node_kernels.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

// Runs the kernel of the node's description (graph/op_desc.h) in T = float or double.
template <class T>
void run_typed(const Node& n, const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Kernel& kernel = op_desc(n.op).kernel;
  KernelFn<T> fn;
  if constexpr (std::is_same_v<T, float>)
    fn = kernel.f32;
  else
    fn = kernel.f64;
  if (!fn) throw Error(std::string("no kernel bound for op ") + op_name(n.op));
  fn(KernelArgs<T>{n, in, out, n.attrs, out[0].data<T>()});
}

}  // namespace

bool is_view_op(Op op) { return op == Op::Reshape; }

bool can_write_over_input(const Node& n, int input) {
  if (n.outputs.size() != 1 || input < 0 || input >= int(n.inputs.size())) return false;
  switch (op_desc(n.op).in_place) {
    case InPlace::AnyInput:
      return true;
    case InPlace::FirstInput:
      return input == 0;
    case InPlace::SecondInput:
      return input == 1;
    case InPlace::Never:
      break;
  }
  return false;
}

void run_f32_node_kernel(const Node& n, const std::vector<Tensor>& inputs,
                         std::vector<Tensor>& outputs) {
  run_typed<float>(n, inputs, outputs);
}

void run_node_kernel(const Graph& g, const Node& n, const std::vector<Tensor>& inputs,
                     std::vector<Tensor>& outputs, const NodeScratch& scratch) {
  switch (g.float_dtype()) {
    case DType::F64:
      return run_typed<double>(n, inputs, outputs);
    case DType::BF16:
      return run_bf16_node_kernel(g, n, inputs, outputs, scratch);
    default:
      return run_typed<float>(n, inputs, outputs);
  }
}

}  // namespace fusetune
