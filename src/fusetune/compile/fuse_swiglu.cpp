#include "fusetune/compile/fuse_swiglu.h"

#include <algorithm>
#include <optional>
#include <unordered_map>

#include "fusetune/compile/rewrite.h"

namespace fusetune::passes::fuse_swiglu {
namespace {

struct Match {
  int mul, silu;                  // forward: p = Mul(s, u) (or Mul(u, s)), s = Silu(g)
  Value g, u;                     //
  int ds = -1, sb = -1, du = -1;  // backward: ds = Mul(dp, u), SiluBackward(g, ds), du = Mul(dp, s)
  Value dp;
};

std::optional<Match> match_at(const Graph& g, const std::vector<std::vector<int>>& readers, int mul,
                              int max_region) {
  const auto& N = g.nodes();
  const Node& m = N[mul];
  if (m.op != Op::Mul || m.backward || m.region > max_region) return std::nullopt;
  const Value a = m.inputs[0], b = m.inputs[1];
  const int known = int(readers.size());  // nodes added by this pass are not matched
  if (a.node >= known || b.node >= known) return std::nullopt;
  if (a == b || g.shape(a) != g.shape(b) || g.type(a).dtype != g.float_dtype() ||
      g.type(b).dtype != g.float_dtype())
    return std::nullopt;
  Match r{};
  r.mul = mul;
  int si = -1;  // which operand is the Silu
  if (N[a.node].op == Op::Silu)
    si = 0;
  else if (N[b.node].op == Op::Silu)
    si = 1;
  else
    return std::nullopt;
  const Value s = m.inputs[si];
  r.u = m.inputs[1 - si];
  r.silu = s.node;
  const Node& sn = N[r.silu];
  if (sn.backward || sn.region > max_region || is_graph_output(g, r.silu)) return std::nullopt;
  r.g = sn.inputs[0];
  // s is read by the Mul and, when the backward needs du, by du = Mul(dp, s); nothing else.
  for (int rd : readers[r.silu]) {
    if (rd == mul) continue;
    const Node& d = N[rd];
    if (r.du >= 0 || d.op != Op::Mul || !d.backward || d.region > max_region ||
        !(d.inputs[1] == s) || d.inputs[0] == s)
      return std::nullopt;
    r.du = rd;
  }
  int mul_reads = 0;
  for (int rd : readers[r.silu]) mul_reads += rd == mul;
  if (mul_reads != 1) return std::nullopt;
  if (r.du < 0) return r;  // forward only (no gradient flows through u, or no backward at all)
  r.dp = N[r.du].inputs[0];
  // ds = Mul(dp, u), read only by SiluBackward(g, ds).
  for (int rd : readers[r.u.node]) {
    const Node& d = N[rd];
    if (d.op != Op::Mul || !d.backward || d.region > max_region || !(d.inputs[0] == r.dp) ||
        !(d.inputs[1] == r.u) || readers[rd].size() != 1 || is_graph_output(g, rd))
      continue;
    const Node& sb = N[readers[rd][0]];
    if (sb.op != Op::SiluBackward || sb.region > max_region || !(sb.inputs[0] == r.g) ||
        !(sb.inputs[1] == Value{rd, 0}))
      continue;
    r.ds = rd;
    r.sb = readers[rd][0];
    break;
  }
  if (r.ds < 0) return std::nullopt;  // a backward of another shape: leave it
  return r;
}

// Adds a node tagged like `like` (region, layer, direction); returns its outputs.
std::vector<Value> add_like(Graph& g, const Node& like, bool backward, Op op, std::vector<Value> in,
                            const std::string& name) {
  auto out = g.add(op, std::move(in), {}, name);
  Node& n = g.mutable_nodes()[out[0].node];
  n.region = like.region;
  n.layer = like.layer;
  n.backward = backward;
  return out;
}

}  // namespace

std::string run(Graph& g, const PassOptions& opts) {
  compact(g);  // dead readers would block a match
  const auto readers = readers_of(g);
  const int n0 = int(g.nodes().size());
  std::unordered_map<int, double> keys;
  int fused = 0, backward = 0, recomputed = 0;
  for (int i = 0; i < n0; ++i) {
    auto m = match_at(g, readers, i, opts.max_region());
    if (!m) continue;
    const Node mul = g.nodes()[m->mul];
    // Inputs as they are now (an earlier rewrite may have redirected them).
    const Value gv = g.nodes()[m->silu].inputs[0];
    const Value uv = mul.inputs[m->u == mul.inputs[0] ? 0 : 1];
    const Value f = add_like(g, mul, false, Op::SwiGLU, {gv, uv}, "swiglu")[0];
    keys[f.node] = double(m->mul);
    // Backward readers of p, directly or through forward reshapes (views), read a recomputed
    // p (reshaped the same way) emitted just before the first of them.
    std::vector<int> views{m->mul};             // p and its forward reshapes, parents first
    std::vector<std::pair<int, int>> bw_reads;  // (view, backward reader)
    for (size_t k = 0; k < views.size(); ++k)
      for (int rd : readers[views[k]]) {
        if (g.nodes()[rd].backward)
          bw_reads.push_back({views[k], rd});
        else if (g.nodes()[rd].op == Op::Reshape)
          views.push_back(rd);
      }
    if (!bw_reads.empty()) {
      int first_bw = bw_reads[0].second;
      for (const auto& vr : bw_reads) first_bw = std::min(first_bw, vr.second);
      std::unordered_map<int, Value> rec;
      rec[m->mul] = add_like(g, mul, true, Op::SwiGLU, {gv, uv}, "swiglu_recompute")[0];
      keys[rec[m->mul].node] = double(first_bw) - 0.5;
      for (size_t k = 1; k < views.size(); ++k) {
        const Node view = g.nodes()[views[k]];
        Attrs at = view.attrs;
        auto r = g.add(Op::Reshape, {rec.at(view.inputs[0].node)}, at);
        Node& rn = g.mutable_nodes()[r[0].node];
        rn.region = view.region;
        rn.layer = view.layer;
        rn.backward = true;
        rec[views[k]] = r[0];
        keys[r[0].node] = double(first_bw) - 0.5;
      }
      for (const auto& [v, rd] : bw_reads)
        for (Value& in : g.mutable_nodes()[rd].inputs)
          if (in == Value{v, 0}) in = rec.at(v);
      ++recomputed;
    }
    replace_all_uses(g, {m->mul, 0}, f);
    if (m->sb >= 0) {
      const Node sb = g.nodes()[m->sb];
      const Value dp = g.nodes()[m->du].inputs[0];
      auto b = add_like(g, sb, true, Op::SwiGLUBackward, {gv, uv, dp}, "swiglu_backward");
      keys[b[0].node] = double(m->sb);
      replace_all_uses(g, {m->sb, 0}, b[0]);
      replace_all_uses(g, {m->du, 0}, b[1]);
      ++backward;
    }
    ++fused;
  }
  if (!fused) return "fuse_swiglu: no match";
  compact(g, keys);
  return "fuse_swiglu: fused " + std::to_string(fused) + " forward, " + std::to_string(backward) +
         " backward, " + std::to_string(recomputed) + " recomputed for the backward";
}

}  // namespace fusetune::passes::fuse_swiglu
