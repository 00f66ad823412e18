#include "fusetune/compile/fuse_linear_log_probs.h"

#include <algorithm>
#include <optional>

#include "fusetune/compile/head_backward.h"
#include "fusetune/compile/rewrite.h"
#include "fusetune/kernels/cpu/fused_linear_cross_entropy.h"

namespace fusetune::passes::fuse_linear_log_probs {
namespace {

struct Match {
  int matmul = -1, log_softmax = -1, gather = -1;  // forward nodes
  std::vector<int> row_sums;                       // RowSum readers of the logits
  int lsb = -1;                                    // LogSoftmaxBackward (absent: forward only)
  int dh = -1, dw = -1;                            // backward matmuls reading dlogits
  int cap = -1, cap_bwd = -1;  // Softcap of the logits (Gemma 2) and its backward
};

std::optional<Match> match_at(const Graph& g, const std::vector<std::vector<int>>& readers,
                              int gather) {
  const auto& N = g.nodes();
  if (N[gather].op != Op::LabelLogProbs) return std::nullopt;
  Match m;
  m.gather = gather;
  m.log_softmax = N[gather].inputs[0].node;
  const Node& ls = N[m.log_softmax];
  if (ls.op != Op::LogSoftmax) return std::nullopt;
  m.matmul = ls.inputs[0].node;
  if (N[m.matmul].op == Op::Softcap) {  // logits soft-capped: the kernel caps them (§3)
    m.cap = m.matmul;
    m.matmul = N[m.cap].inputs[0].node;
    if (is_graph_output(g, m.cap) || readers[m.matmul].size() != 1) return std::nullopt;
  }
  const int logits = m.cap >= 0 ? m.cap : m.matmul;
  const Node& mm = N[m.matmul];
  const bool nf4 = mm.op == Op::NF4MatMul;
  if (!nf4 && (mm.op != Op::MatMul || mm.attrs.trans_a || !mm.attrs.trans_b)) return std::nullopt;
  if (mm.outputs[0].shape.size() != 2 || g.shape(mm.inputs[0]).size() != 2) return std::nullopt;
  if (is_graph_output(g, m.matmul) || is_graph_output(g, m.log_softmax)) return std::nullopt;
  // The logits feed the log_softmax and, for the metrics, row sums (and a cap's backward);
  // nothing else.
  for (int r : readers[logits]) {
    if (r == m.log_softmax) continue;
    if (m.cap >= 0 && N[r].op == Op::SoftcapBackward && m.cap_bwd < 0) {
      m.cap_bwd = r;
      continue;
    }
    if (N[r].op != Op::RowSum || is_graph_output(g, r)) return std::nullopt;
    m.row_sums.push_back(r);
  }
  // The log-probs feed the gather and, in a training graph, its VJP.
  for (int r : readers[m.log_softmax]) {
    if (r == gather) continue;
    if (N[r].op != Op::LogSoftmaxBackward || m.lsb >= 0) return std::nullopt;
    m.lsb = r;
  }
  if (std::count(readers[m.log_softmax].begin(), readers[m.log_softmax].end(), gather) != 1)
    return std::nullopt;
  if (m.lsb < 0) return m.cap_bwd < 0 ? std::optional<Match>(m) : std::nullopt;
  const Node& lsb = N[m.lsb];
  const Node& gb = N[lsb.inputs[1].node];
  if (gb.op != Op::LabelLogProbsBackward || !(gb.inputs[1] == N[gather].inputs[1]) ||
      readers[lsb.inputs[1].node].size() != 1)
    return std::nullopt;
  int dlogits = m.lsb;
  if (m.cap >= 0) {  // SoftcapBackward(capped logits, dlogits) is the lsb's only reader
    const Node& cb = N[std::max(m.cap_bwd, 0)];
    if (m.cap_bwd < 0 || readers[m.lsb].size() != 1 || readers[m.lsb][0] != m.cap_bwd ||
        !(cb.inputs[0] == Value{m.cap, 0}) || !(cb.inputs[1] == Value{m.lsb, 0}) ||
        cb.attrs.scalar != N[m.cap].attrs.scalar)
      return std::nullopt;
    dlogits = m.cap_bwd;
  }
  const auto back = match_head_backward(g, readers, m.matmul, dlogits);
  if (!back) return std::nullopt;
  m.dh = back->dh;
  m.dw = back->dw;
  return m;
}

// Whether the forward hands its logits to the backward instead of the backward recomputing
// them (one GEMM of the head's three in the backward): when the head trains and is dense and
// uncapped, every row fits one chunk (so the kept logits are the chunk the forward formed in
// scratch anyway, and only the loss's few per-token nodes run while they are held) and the
// graph computes in its stored dtype (a bf16 graph would round them).
bool keeps_logits(const Graph& g, const Match& m, bool tiled, int64_t rows, int64_t chunk_rows) {
  return m.lsb >= 0 && m.dw >= 0 && m.cap < 0 && !tiled && g.nodes()[m.matmul].op == Op::MatMul &&
         rows <= chunk_rows && g.float_dtype() == g.compute_dtype();
}

}  // namespace

std::string run(Graph& g, const PassOptions& opts) {
  if (opts.max_region() < 1)
    return "fuse_linear_log_probs: skipped (the loss region is not compiled)";
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
    const Node gather = g.nodes()[m->gather];
    const bool nf4 = mm.op == Op::NF4MatMul;
    const Value h = mm.inputs[0], labels = gather.inputs[1];
    std::vector<Value> head(mm.inputs.begin() + 1, mm.inputs.end());
    vocab = g.shape({m->matmul, 0})[1];
    Attrs at;
    if (m->cap >= 0) at.softcap = g.nodes()[m->cap].attrs.scalar;
    const bool tiled = nf4 || g.type(head[0]).dtype == DType::BF16;  // formed tile by tile
    at.chunk_rows = chunk = kernels::fused_ce_chunk_rows(
        g.shape(h)[0], vocab, int64_t(dtype_size(g.compute_dtype())), opts.ce_budget(tiled));
    if (nf4) {
      at.shape = mm.attrs.shape;
      at.scalar = mm.attrs.scalar;
    }
    std::vector<Value> fin{h, labels};
    fin.insert(fin.end(), head.begin(), head.end());
    // A frozen head (no dW reader) with a backward: the forward also keeps E_p[W] per row and
    // the backward needs no GEMM (kernels/cpu/fused_linear_log_probs.h).
    at.no_weight_grad = m->lsb >= 0 && m->dw < 0;
    at.keep_logits =
        opts.keep_head_logits && keeps_logits(g, *m, tiled, g.shape(h)[0], at.chunk_rows);
    g.set_region(1);
    const std::vector<Value> f = g.add(Op::FusedLinearLogProbs, fin, at, "fused_linear_log_probs");
    std::unordered_map<int, double> keys{{f[0].node, double(m->gather)}};
    if (m->lsb >= 0) {
      const Node& lsb = g.nodes()[m->lsb];
      const Value dlogp = g.nodes()[lsb.inputs[1].node].inputs[0];
      std::vector<Value> bin{at.no_weight_grad ? f[3] : h, labels, f[1], dlogp};
      bin.insert(bin.end(), head.begin(), head.end());
      if (at.keep_logits) bin.push_back(f[3]);
      g.set_backward(true);
      const std::vector<Value> b =
          g.add(Op::FusedLinearLogProbsBackward, bin, at, "fused_linear_log_probs_backward");
      g.set_backward(false);
      keys[b[0].node] = double(m->lsb);
      if (m->dh >= 0) replace_all_uses(g, {m->dh, 0}, b[0]);
      if (m->dw >= 0) replace_all_uses(g, {m->dw, 0}, b[1]);
    }
    g.set_region(0);
    replace_all_uses(g, {m->gather, 0}, f[0]);
    for (int r : m->row_sums) replace_all_uses(g, {r, 0}, f[2]);
    compact(g, keys);
    ++fused;
    i = -1;  // indices changed: rescan
  }
  if (!fused) return "fuse_linear_log_probs: no match";
  return "fuse_linear_log_probs: fused " + std::to_string(fused) + " (chunk " +
         std::to_string(chunk) + " tokens x vocab " + std::to_string(vocab) + ")";
}

}  // namespace fusetune::passes::fuse_linear_log_probs
