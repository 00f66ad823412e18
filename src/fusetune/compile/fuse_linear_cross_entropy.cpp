#include "fusetune/compile/fuse_linear_cross_entropy.h"

#include <algorithm>
#include <optional>

#include "fusetune/compile/head_backward.h"
#include "fusetune/compile/rewrite.h"
#include "fusetune/kernels/cpu/fused_linear_cross_entropy.h"

namespace fusetune::passes::fuse_linear_cross_entropy {
namespace {

struct Match {
  int matmul, log_softmax, nll, loss;  // forward nodes
  int dh = -1, dw = -1;                // backward matmuls reading dlogits (either may be absent)
  int cap = -1, cap_bwd = -1;          // Softcap of the logits (Gemma 2) and its backward
};

std::optional<Match> match_at(const Graph& g, const std::vector<std::vector<int>>& readers,
                              int nll) {
  const auto& N = g.nodes();
  const Node& nn = N[nll];
  if (nn.op != Op::Nll) return std::nullopt;
  Match m{};
  m.nll = nll;
  m.log_softmax = nn.inputs[0].node;
  const Node& ls = N[m.log_softmax];
  if (ls.op != Op::LogSoftmax) return std::nullopt;
  m.matmul = ls.inputs[0].node;
  if (N[m.matmul].op == Op::Softcap) {  // logits soft-capped: the kernel caps them (§3)
    m.cap = m.matmul;
    m.matmul = N[m.cap].inputs[0].node;
    if (is_graph_output(g, m.cap)) return std::nullopt;
  }
  const Node& mm = N[m.matmul];
  // The head: a dense h W^T, a frozen NF4 head (QLoRA) whose only gradient is dh, or a
  // fake-quantized h fq(W)^T (QAT).
  const bool tiled = mm.op == Op::NF4MatMul || mm.op == Op::FakeQuantMatMul;
  if (!tiled && (mm.op != Op::MatMul || mm.attrs.trans_a || !mm.attrs.trans_b)) return std::nullopt;
  if (mm.outputs[0].shape.size() != 2) return std::nullopt;
  // The logits feed only the log_softmax, and are not a graph output.
  if (readers[m.matmul].size() != 1 || is_graph_output(g, m.matmul)) return std::nullopt;
  // The nll feeds exactly one Mul by a scalar: the loss.
  if (readers[nll].size() != 1 || is_graph_output(g, nll)) return std::nullopt;
  m.loss = readers[nll][0];
  const Node& ln = N[m.loss];
  if (ln.op != Op::Mul || !(ln.inputs[0] == Value{nll, 0}) || !g.shape(ln.inputs[1]).empty())
    return std::nullopt;
  const Value scale = ln.inputs[1];
  // Backward: log_softmax's other reader is its VJP, fed by NllBackward(Mul(seed 1, scale)).
  int lsb = -1;
  for (int r : readers[m.log_softmax])
    if (r != nll) {
      if (lsb >= 0 || N[r].op != Op::LogSoftmaxBackward) return std::nullopt;
      lsb = r;
    }
  if (lsb < 0) return std::nullopt;  // forward-only graph: nothing to fuse the backward with
  const Node& nb = N[N[lsb].inputs[1].node];
  if (nb.op != Op::NllBackward || !(nb.inputs[1] == nn.inputs[1])) return std::nullopt;
  const Node& dl = N[nb.inputs[0].node];
  if (dl.op != Op::Mul || !(dl.inputs[1] == scale)) return std::nullopt;
  const Node& seed = N[dl.inputs[0].node];
  if (seed.op != Op::Fill || seed.attrs.scalar != 1.0 || !seed.outputs[0].shape.empty())
    return std::nullopt;
  // The loss's own gradient must be that seed: the loss is the graph's differentiated output.
  if (!is_graph_output(g, m.loss)) return std::nullopt;
  if (readers[N[lsb].inputs[1].node].size() != 1) return std::nullopt;
  int dlogits = lsb;
  if (m.cap >= 0) {  // the capped logits feed the log_softmax and SoftcapBackward(them, dlogp)
    if (readers[lsb].size() != 1 || readers[m.cap].size() != 2) return std::nullopt;
    m.cap_bwd = readers[lsb][0];
    const Node& cb = N[m.cap_bwd];
    if (cb.op != Op::SoftcapBackward || !(cb.inputs[0] == Value{m.cap, 0}) ||
        !(cb.inputs[1] == Value{lsb, 0}) || cb.attrs.scalar != N[m.cap].attrs.scalar)
      return std::nullopt;
    dlogits = m.cap_bwd;
  }
  const auto back = match_head_backward(g, readers, m.matmul, dlogits);
  if (!back) return std::nullopt;
  m.dh = back->dh;
  m.dw = back->dw;
  return m;
}

}  // namespace

std::string run(Graph& g, const PassOptions& opts) {
  if (opts.max_region() < 1)
    return "fuse_linear_cross_entropy: skipped (the loss region is not compiled)";
  int fused = 0;
  int64_t chunk = 0, vocab = 0;
  // The readers are recomputed only after a fusion changed the graph (once per node was
  // quadratic: seconds on an 8B model's step).
  std::vector<std::vector<int>> readers;
  bool stale = true;
  for (int i = 0; i < int(g.nodes().size()); ++i) {
    if (stale) readers = readers_of(g);
    stale = false;
    auto m = match_at(g, readers, i);
    if (!m) continue;
    stale = true;
    const Node mm = g.nodes()[m->matmul];
    const bool nf4 = mm.op == Op::NF4MatMul;
    const Value h = mm.inputs[0];
    const Value labels = g.nodes()[m->nll].inputs[1];
    const Value scale = g.nodes()[m->loss].inputs[1];
    const int64_t N = g.shape(h)[0];
    vocab = g.shape({m->matmul, 0})[1];
    Attrs at;
    if (m->cap >= 0) at.softcap = g.nodes()[m->cap].attrs.scalar;
    const bool tiled = nf4 || mm.op == Op::FakeQuantMatMul ||
                       g.type(mm.inputs[1]).dtype == DType::BF16;  // formed tile by tile
    at.chunk_rows = chunk = kernels::fused_ce_chunk_rows(
        N, vocab, int64_t(dtype_size(g.compute_dtype())), opts.ce_budget(tiled));
    g.set_region(1);
    std::vector<Value> f;
    if (nf4) {
      // The NF4 head is dequantized tile by tile inside the chunked GEMMs; no dW (frozen).
      at.shape = mm.attrs.shape;
      at.scalar = mm.attrs.scalar;
      f = g.add(Op::FusedNF4LinearCrossEntropy,
                {h, labels, scale, mm.inputs[1], mm.inputs[2], mm.inputs[3]}, at,
                "fused_nf4_linear_ce");
    } else {
      // A frozen head (LoRA) has no dW reader: the kernel then skips the dW GEMM and the
      // [V, D] output altogether.
      at.no_weight_grad = m->dw < 0;
      std::vector<Value> in{h, mm.inputs[1], labels, scale};
      if (mm.op == Op::FakeQuantMatMul) {
        // QAT: fq(W) formed tile by tile inside the chunked GEMMs, switched by the same input.
        // dW stays w.r.t. fq(W); a masking scheme's FakeQuantizeBackward still reads it.
        at.groups = mm.attrs.groups;
        at.len = mm.attrs.len;
        in.push_back(mm.inputs[2]);
      }
      f = g.add(Op::FusedLinearCrossEntropy, in, at,
                mm.op == Op::FakeQuantMatMul ? "fused_fake_quant_linear_ce" : "fused_linear_ce");
    }
    g.set_region(0);
    replace_all_uses(g, {m->loss, 0}, f[0]);
    if (m->dh >= 0) replace_all_uses(g, {m->dh, 0}, f[1]);
    if (m->dw >= 0) replace_all_uses(g, {m->dw, 0}, f[2]);
    compact(g, {{f[0].node, double(m->nll)}});
    ++fused;
    i = -1;  // indices changed: rescan
  }
  if (!fused) return "fuse_linear_cross_entropy: no match";
  return "fuse_linear_cross_entropy: fused " + std::to_string(fused) + " (chunk " +
         std::to_string(chunk) + " tokens x vocab " + std::to_string(vocab) + ")";
}

}  // namespace fusetune::passes::fuse_linear_cross_entropy
