#include "fusetune/compile/head_backward.h"

#include <algorithm>

namespace fusetune {

std::optional<HeadBackward> match_head_backward(const Graph& g,
                                                const std::vector<std::vector<int>>& readers,
                                                int head, int dlogits) {
  const Node& mm = g.nodes()[head];
  const Value dz{dlogits, 0};
  HeadBackward m;
  for (int r : readers[dlogits]) {
    const Node& bm = g.nodes()[r];
    if (mm.op == Op::NF4MatMul) {  // the same NF4 weight, transposed: dz W
      if (bm.op != Op::NF4MatMulBackward || m.dh >= 0 || !(bm.inputs[0] == dz) ||
          !std::equal(bm.inputs.begin() + 1, bm.inputs.end(), mm.inputs.begin() + 1) ||
          bm.attrs.shape != mm.attrs.shape || bm.attrs.scalar != mm.attrs.scalar)
        return std::nullopt;
      m.dh = r;
      continue;
    }
    if (mm.op == Op::FakeQuantMatMul && bm.op == Op::FakeQuantMatMulBackward) {
      // dz fq(W): the same weight, switch and scheme
      if (m.dh >= 0 || !(bm.inputs[0] == dz) || !(bm.inputs[1] == mm.inputs[1]) ||
          !(bm.inputs[2] == mm.inputs[2]) || bm.attrs.groups != mm.attrs.groups ||
          bm.attrs.len != mm.attrs.len)
        return std::nullopt;
      m.dh = r;
      continue;
    }
    if (bm.op != Op::MatMul || !(bm.inputs[0] == dz)) return std::nullopt;
    if (mm.op == Op::MatMul && !bm.attrs.trans_a && !bm.attrs.trans_b &&
        bm.inputs[1] == mm.inputs[1] && m.dh < 0)
      m.dh = r;  // dz W
    else if (bm.attrs.trans_a && !bm.attrs.trans_b && bm.inputs[1] == mm.inputs[0] && m.dw < 0)
      m.dw = r;  // dz^T h
    else
      return std::nullopt;
  }
  return m;
}

}  // namespace fusetune
