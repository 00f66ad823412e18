#include "fusetune/compile/fuse_linear_divergence.h"

#include <algorithm>
#include <optional>

#include "fusetune/compile/rewrite.h"
#include "fusetune/kernels/cpu/fused_linear_cross_entropy.h"

namespace fusetune::passes::fuse_linear_divergence {
namespace {

// Whether node `target` is among the ancestors of `v` (its inputs, recursively).
bool depends_on(const Graph& g, Value v, int target) {
  std::vector<char> seen(g.nodes().size(), 0);
  std::vector<int> stack{v.node};
  while (!stack.empty()) {
    const int n = stack.back();
    stack.pop_back();
    if (n == target) return true;
    if (seen[size_t(n)]) continue;
    seen[size_t(n)] = 1;
    for (const Value& in : g.nodes()[size_t(n)].inputs) stack.push_back(in.node);
  }
  return false;
}

// The backward node of the FusedLinearDivergence `fwd`: a FusedLinearDivergenceBackward over
// the same inputs and attributes whose dy does not depend on the forward.
std::optional<int> backward_of(const Graph& g, int fwd) {
  const Node& f = g.nodes()[size_t(fwd)];
  if (f.op != Op::FusedLinearDivergence) return std::nullopt;
  for (int i = fwd + 1; i < int(g.nodes().size()); ++i) {
    const Node& b = g.nodes()[size_t(i)];
    if (b.op != Op::FusedLinearDivergenceBackward ||
        !std::equal(f.inputs.begin(), f.inputs.end(), b.inputs.begin() + 1) ||
        b.attrs.groups != f.attrs.groups || b.attrs.scalar != f.attrs.scalar ||
        b.attrs.eps != f.attrs.eps || b.attrs.shape != f.attrs.shape ||
        b.attrs.start != f.attrs.start)
      continue;
    if (depends_on(g, b.inputs[0], fwd)) return std::nullopt;
    return i;
  }
  return std::nullopt;
}

}  // namespace

std::string run(Graph& g, const PassOptions& opts) {
  bool any = false;
  for (const Node& n : g.nodes()) any |= n.op == Op::FusedLinearDivergence;
  if (!any) return "";
  if (opts.max_region() < 1)
    return "fuse_linear_divergence: skipped (the loss region is not compiled)";
  int fused = 0;
  int64_t chunk = 0;
  for (int i = 0; i < int(g.nodes().size()); ++i) {
    const auto b = backward_of(g, i);
    if (!b) continue;
    const Node bn = g.nodes()[size_t(*b)];
    // The backward's inputs (ops/distillation.h): dy, h, the student's head (W, or an NF4
    // head's three parts with attrs.shape = [V, D]), teacher_h, teacher_W, labels, ...
    const bool nf4 = !bn.attrs.shape.empty();
    const size_t teacher_W = nf4 ? 6 : 4;
    const int64_t N = g.shape(bn.inputs[1])[0];
    const int64_t V = nf4 ? bn.attrs.shape[0] : g.shape(bn.inputs[2])[0];
    Attrs a = bn.attrs;
    // Two [chunk, V] blocks (student and teacher; a third with DoRA's column scale, attrs.dim1:
    // the unscaled logits its gradient reads) share the cross-entropy's budget; a bf16 or NF4
    // head re-formed tile by tile gets the tiled heads' larger one.
    const bool tiled = nf4 || g.type(bn.inputs[2]).dtype == DType::BF16 ||
                       g.type(bn.inputs[teacher_W]).dtype == DType::BF16;
    const int64_t blocks = a.dim1 == 1 ? 3 : 2;
    a.chunk_rows = chunk = kernels::fused_ce_chunk_rows(
        N, V, int64_t(dtype_size(g.compute_dtype())), opts.ce_budget(tiled) / blocks);
    g.set_region(1);
    const std::vector<Value> f =
        g.add(Op::FusedLinearDivergenceBackward, bn.inputs, a, "fused_linear_divergence");
    g.set_region(0);
    for (size_t k = 0; k < f.size(); ++k) replace_all_uses(g, {*b, int(k)}, f[k]);
    replace_all_uses(g, {i, 0}, f[0]);
    compact(g, {{f[0].node, double(i)}});
    ++fused;
    i = -1;  // indices changed: rescan
  }
  if (!fused) return "fuse_linear_divergence: no match";
  return "fuse_linear_divergence: fused " + std::to_string(fused) + " (chunk " +
         std::to_string(chunk) + " tokens)";
}

}  // namespace fusetune::passes::fuse_linear_divergence
