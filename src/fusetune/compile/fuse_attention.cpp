#include "fusetune/compile/fuse_attention.h"

#include <algorithm>
#include <initializer_list>
#include <optional>

#include "fusetune/compile/rewrite.h"

namespace fusetune::passes::fuse_attention {
namespace {

// One attention site: node ids (-1 = absent) and the values the fused ops read.
struct Site {
  // forward
  int qt = -1, kt = -1, krep = -1, vt = -1, vrep = -1;
  int scores = -1, scaled = -1, capped = -1, masked = -1, probs = -1, pv = -1, out = -1;
  Value q, k, v, doc;
  double scale = 0.0;
  double softcap = 0.0;  // a Softcap between the Scale and the mask (Gemma 2), and the mask's
  int64_t window = 0;    // sliding window
  int cap_bwd = -1;      // its SoftcapBackward
  // backward: Transpose(do), the MatMuls, softmax/mask/scale backward, RepeatHeadsBackward,
  // and the final Transposes to [B, T, heads, hd] whose values the fused backward replaces.
  int dctx = -1, dprobs = -1, dv_h = -1, sm_bwd = -1, mask_bwd = -1, dscaled = -1;
  int dq_h = -1, dk_h = -1, dk_rep = -1, dv_rep = -1, dq = -1, dk = -1, dv = -1;
  Value dout;

  std::vector<int> nodes() const {
    std::vector<int> all{qt,   kt,     krep,   vt,     vrep, scores, scaled,   masked,  probs,
                         pv,   out,    dctx,   dprobs, dv_h, sm_bwd, mask_bwd, dscaled, dq_h,
                         dk_h, dk_rep, dv_rep, dq,     dk,   dv,     capped,   cap_bwd};
    all.erase(std::remove(all.begin(), all.end(), -1), all.end());
    return all;
  }
};

class Matcher {
 public:
  Matcher(const Graph& g, int max_region)
      : g_(g),
        N_(g.nodes()),
        readers_(N_.size()),
        is_output_(N_.size(), false),
        max_region_(max_region) {
    for (size_t i = 0; i < N_.size(); ++i)
      for (const Value& v : N_[i].inputs) {
        auto& r = readers_[size_t(v.node)];
        if (r.empty() || r.back() != int(i)) r.push_back(int(i));
      }
    for (const auto& [name, v] : g.outputs()) is_output_[size_t(v.node)] = true;
  }

  std::optional<Site> at(int p) const {
    Site s;
    if (!forward(p, s) || !backward(s) || !exclusive(s)) return std::nullopt;
    for (int n : s.nodes())
      if (N_[size_t(n)].region > max_region_) return std::nullopt;
    return s;
  }

 private:
  const Graph& g_;
  const std::vector<Node>& N_;
  std::vector<std::vector<int>> readers_;
  std::vector<bool> is_output_;
  int max_region_;

  const Node& node(int i) const { return N_[size_t(i)]; }
  const std::vector<int>& readers(int i) const { return readers_[size_t(i)]; }

  // Transpose of dims 1 and 2 of a rank-4 tensor ([B,T,H,hd] <-> [B,H,T,hd]).
  bool swap12(int i) const {
    const Node& n = node(i);
    if (n.op != Op::Transpose || g_.shape(n.inputs[0]).size() != 4) return false;
    const int a = n.attrs.dim0 < 0 ? n.attrs.dim0 + 4 : n.attrs.dim0;
    const int b = n.attrs.dim1 < 0 ? n.attrs.dim1 + 4 : n.attrs.dim1;
    return std::min(a, b) == 1 && std::max(a, b) == 2;
  }

  // Node i is read only by nodes in `allowed` (-1 entries ignored) and is no graph output.
  bool only(int i, std::initializer_list<int> allowed) const {
    if (is_output_[size_t(i)]) return false;
    for (int r : readers(i))
      if (std::find(allowed.begin(), allowed.end(), r) == allowed.end()) return false;
    return true;
  }

  // The single reader of node i (-1 if none or several, or i is a graph output).
  int sole_reader(int i) const {
    return readers(i).size() == 1 && !is_output_[size_t(i)] ? readers(i)[0] : -1;
  }

  // [B, KV*g, T, hd] value feeding the attention: [RepeatHeads] <- Transpose(1,2) <- src.
  bool kv_side(Value hv, int& t, int& rep, Value& src) const {
    int n = hv.node;
    if (node(n).op == Op::RepeatHeads) {
      rep = n;
      n = node(n).inputs[0].node;
    }
    if (!swap12(n)) return false;
    t = n;
    src = node(n).inputs[0];
    return true;
  }

  bool is_float(Value v) const { return g_.type(v).dtype == g_.float_dtype(); }

  bool forward(int p, Site& s) const {
    if (node(p).op != Op::Softmax) return false;
    s.probs = p;
    s.masked = node(p).inputs[0].node;
    const Node& mk = node(s.masked);
    if (mk.op != Op::CausalMask) return false;
    if (mk.inputs.size() == 2) s.doc = mk.inputs[1];
    s.window = mk.attrs.window;
    s.scaled = mk.inputs[0].node;
    if (node(s.scaled).op == Op::Softcap) {
      s.capped = s.scaled;
      s.softcap = node(s.capped).attrs.scalar;
      s.scaled = node(s.capped).inputs[0].node;
    }
    const Node& sc = node(s.scaled);
    if (sc.op != Op::Scale) return false;
    s.scale = sc.attrs.scalar;
    s.scores = sc.inputs[0].node;
    const Node& mm = node(s.scores);
    if (mm.op != Op::MatMul || mm.attrs.trans_a || !mm.attrs.trans_b) return false;
    if (!swap12(mm.inputs[0].node)) return false;
    s.qt = mm.inputs[0].node;
    s.q = node(s.qt).inputs[0];
    if (!kv_side(mm.inputs[1], s.kt, s.krep, s.k)) return false;
    const Value pv{p, 0};
    for (int r : readers(p)) {
      const Node& n = node(r);
      const bool plain_mm = n.op == Op::MatMul && n.inputs[0] == pv && !n.attrs.trans_b;
      int* slot = nullptr;
      if (plain_mm && !n.attrs.trans_a && !(n.inputs[1] == pv))
        slot = &s.pv;  // probs @ v
      else if (plain_mm && n.attrs.trans_a && !(n.inputs[1] == pv))
        slot = &s.dv_h;  // probs^T @ dctx
      else if (n.op == Op::SoftmaxBackward && n.inputs[0] == pv && !(n.inputs[1] == pv))
        slot = &s.sm_bwd;
      if (slot == nullptr || *slot >= 0) return false;
      *slot = r;
    }
    if (s.pv < 0 || !kv_side(node(s.pv).inputs[1], s.vt, s.vrep, s.v)) return false;
    s.out = sole_reader(s.pv);
    if (s.out < 0 || !swap12(s.out)) return false;
    // Shapes: q [B,T,H,hd], k = v [B,T,KV,hd], H = KV * groups.
    const Shape &qs = g_.shape(s.q), &ks = g_.shape(s.k);
    if (qs.size() != 4 || ks.size() != 4 || g_.shape(s.v) != ks || qs[0] != ks[0] ||
        qs[1] != ks[1] || qs[3] != ks[3] || ks[2] < 1 || qs[2] % ks[2])
      return false;
    if (!is_float(s.q) || !is_float(s.k) || !is_float(s.v)) return false;
    const int64_t groups = qs[2] / ks[2];
    for (int rep : {s.krep, s.vrep})
      if (rep >= 0 ? node(rep).attrs.groups != groups : groups != 1) return false;
    return true;
  }

  // Follows a [B,H,T,hd] gradient back to [B,T,heads,hd]: [RepeatHeadsBackward] -> Transpose.
  bool grad_chain(int mm, int rep_fwd, int& rep_bwd, int& final) const {
    if (mm < 0) return true;
    int n = mm;
    if (rep_fwd >= 0) {
      const int r = sole_reader(n);
      if (r < 0 || node(r).op != Op::RepeatHeadsBackward ||
          node(r).attrs.groups != node(rep_fwd).attrs.groups)
        return false;
      rep_bwd = n = r;
    }
    const int t = sole_reader(n);
    if (t < 0 || !swap12(t)) return false;
    final = t;
    return true;
  }

  bool backward(Site& s) const {
    const Node& mm = node(s.scores);
    const Value vh = node(s.pv).inputs[1];
    if (s.sm_bwd >= 0) {
      s.dprobs = node(s.sm_bwd).inputs[1].node;
      const Node& dp = node(s.dprobs);
      if (dp.op != Op::MatMul || dp.attrs.trans_a || !dp.attrs.trans_b || !(dp.inputs[1] == vh))
        return false;
      s.dctx = dp.inputs[0].node;
      s.mask_bwd = sole_reader(s.sm_bwd);
      if (s.mask_bwd < 0) return false;
      const Node& mb = node(s.mask_bwd);
      const size_t arity = node(s.masked).inputs.size();
      if (mb.op != Op::CausalMaskBackward || !(mb.inputs[0] == Value{s.sm_bwd, 0}) ||
          mb.inputs.size() != arity || (arity == 2 && !(mb.inputs[1] == s.doc)) ||
          mb.attrs.window != s.window)
        return false;
      int dmasked = s.mask_bwd;
      if (s.capped >= 0) {  // SoftcapBackward(capped scores, dmasked)
        s.cap_bwd = sole_reader(s.mask_bwd);
        if (s.cap_bwd < 0) return false;
        const Node& cb = node(s.cap_bwd);
        if (cb.op != Op::SoftcapBackward || !(cb.inputs[0] == Value{s.capped, 0}) ||
            !(cb.inputs[1] == Value{s.mask_bwd, 0}) || cb.attrs.scalar != s.softcap)
          return false;
        dmasked = s.cap_bwd;
      }
      s.dscaled = sole_reader(dmasked);
      if (s.dscaled < 0) return false;
      const Node& ds = node(s.dscaled);
      if (ds.op != Op::Scale || ds.attrs.scalar != s.scale) return false;
      const Value dsv{s.dscaled, 0};
      for (int r : readers(s.dscaled)) {
        const Node& n = node(r);
        if (n.op != Op::MatMul || !(n.inputs[0] == dsv) || n.attrs.trans_b) return false;
        int* slot = !n.attrs.trans_a && n.inputs[1] == mm.inputs[1]  ? &s.dq_h  // dS @ k
                    : n.attrs.trans_a && n.inputs[1] == mm.inputs[0] ? &s.dk_h  // dS^T @ q
                                                                     : nullptr;
        if (slot == nullptr || *slot >= 0) return false;
        *slot = r;
      }
      if (!only(s.dprobs, {s.sm_bwd})) return false;
    }
    if (s.dv_h >= 0) {
      const int dc = node(s.dv_h).inputs[1].node;
      if (s.dctx >= 0 && dc != s.dctx) return false;
      s.dctx = dc;
    }
    if (s.dctx < 0) return true;  // forward only
    if (!swap12(s.dctx)) return false;
    s.dout = node(s.dctx).inputs[0];
    if (g_.shape(s.dout) != g_.shape(s.q) || !is_float(s.dout)) return false;
    if (!only(s.dctx, {s.dprobs, s.dv_h})) return false;
    int none = -1;
    return grad_chain(s.dq_h, -1, none, s.dq) && grad_chain(s.dk_h, s.krep, s.dk_rep, s.dk) &&
           grad_chain(s.dv_h, s.vrep, s.dv_rep, s.dv);
  }

  // Everything between q/k/v and the output is read only by the pattern, so it all dies.
  bool exclusive(const Site& s) const {
    const int kh = s.krep >= 0 ? s.krep : s.kt, vh = s.vrep >= 0 ? s.vrep : s.vt;
    if (s.krep >= 0 && !only(s.kt, {s.krep})) return false;
    if (s.vrep >= 0 && !only(s.vt, {s.vrep})) return false;
    return only(s.qt, {s.scores, s.dk_h}) && only(kh, {s.scores, s.dq_h}) &&
           only(vh, {s.pv, s.dprobs}) && only(s.scores, {s.scaled}) &&
           (s.capped < 0 ? only(s.scaled, {s.masked})
                         : only(s.scaled, {s.capped}) && only(s.capped, {s.masked, s.cap_bwd})) &&
           only(s.masked, {s.probs}) && !is_output_[size_t(s.probs)] && !is_output_[size_t(s.pv)];
  }
};

}  // namespace

std::string run(Graph& g, const PassOptions& opts) {
  std::vector<Site> sites;
  {
    const Matcher m(g, opts.max_region());
    for (int i = 0; i < int(g.nodes().size()); ++i)
      if (g.nodes()[size_t(i)].op == Op::Softmax)
        if (auto s = m.at(i)) sites.push_back(*s);
  }
  if (sites.empty()) return "fuse_attention: no match";
  std::unordered_map<int, double> keys;
  int with_backward = 0;
  for (const Site& s : sites) {
    const Node probs = g.nodes()[size_t(s.probs)];
    g.set_region(probs.region);
    g.set_layer(probs.layer);
    g.set_backward(false);
    Attrs at;
    at.scalar = s.scale;
    at.softcap = s.softcap;
    at.window = s.window;
    std::vector<Value> in{s.q, s.k, s.v};
    if (s.doc.valid()) in.push_back(s.doc);
    const std::vector<Value> f = g.add(Op::FlashAttention, in, at, "flash_attention");
    keys[f[0].node] = double(s.scores);
    replace_all_uses(g, {s.out, 0}, f[0]);
    if (s.dctx >= 0) {
      const Node dctx = g.nodes()[size_t(s.dctx)];
      g.set_region(dctx.region);
      g.set_layer(dctx.layer);
      g.set_backward(true);
      in = {s.q, s.k, s.v, f[0], f[1], s.dout};
      if (s.doc.valid()) in.push_back(s.doc);
      const std::vector<Value> b = g.add(Op::FlashAttentionBackward, in, at, "flash_attention_bwd");
      keys[b[0].node] = double(s.dctx);
      if (s.dq >= 0) replace_all_uses(g, {s.dq, 0}, b[0]);
      if (s.dk >= 0) replace_all_uses(g, {s.dk, 0}, b[1]);
      if (s.dv >= 0) replace_all_uses(g, {s.dv, 0}, b[2]);
      ++with_backward;
    }
  }
  g.set_region(0);
  g.set_layer(-1);
  g.set_backward(false);
  compact(g, keys);
  return "fuse_attention: fused " + std::to_string(sites.size()) + " (" +
         std::to_string(with_backward) + " with their backward)";
}

}  // namespace fusetune::passes::fuse_attention
