#pragma once
// Losses and fused LM heads: NLL, per-token label log-probs, and the chunked head + loss ops
// compile passes create. One entry per op (graph/op_desc.h, docs/design.md §1): to add an op, copy
// a neighbour's entry and list it in the family's ops at the end of this file.
#include <algorithm>
#include <type_traits>

#include "fusetune/graph/op_desc.h"
#include "fusetune/kernels/cpu/bf16_matmul.h"
#include "fusetune/kernels/cpu/fake_quant.h"
#include "fusetune/kernels/cpu/fused_linear_cross_entropy.h"
#include "fusetune/kernels/cpu/fused_linear_log_probs.h"
#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/kernels/cpu/nf4.h"
#include "fusetune/kernels/cpu/preference_ops.h"
#include "fusetune/ops/shape_rules.h"

namespace fusetune::ops {

namespace k = kernels;

inline constexpr OpDesc kNll = {
    .op = Op::Nll,
    .name = "nll",
    .min_inputs = 2,
    .max_inputs = 2,
    .shape = [](const ShapeCheck& c) -> Types {
      c.need_i32(1);
      if (c.S(0).size() != 2 || c.S(1) != Shape{c.S(0)[0]})
        c.fail("expects logp [N, V] and labels [N], got " + shape_str(c.S(0)) + " and " +
               shape_str(c.S(1)));
      return {{Shape{}, c.fd}};
    },
    .vjp =
        [](VjpContext& c) {
          Attrs at;
          at.dim0 = int(c.g.shape(c.in[0])[1]);
          c.dx[0] = c.op(Op::NllBackward, {c.dy, c.in[1]}, at);
        },
    .gradcheck =
        [](GradcheckCase& t) {
          Value labels = t.ids("labels", {4}, {2, -100, 0, 4});  // one row ignored
          return t.g.add1(Op::Nll, {t.param("logp", {4, 5}, -3, 0), labels});
        },
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          c.Y[0] = T(k::nll_sum<T>(c.X(0), c.I(1), c.in[0].dim(0), c.in[0].dim(1)));
        },
};

inline constexpr OpDesc kNllBackward = {
    .op = Op::NllBackward,
    .name = "nll_backward",
    .min_inputs = 2,
    .max_inputs = 2,
    .shape = [](const ShapeCheck& c) -> Types {
      c.need_i32(1);
      if (!c.S(0).empty() || c.S(1).size() != 1) c.fail("expects a scalar grad and labels [N]");
      return {{Shape{c.S(1)[0], c.a.dim0}, c.fd}};
    },
    .no_vjp = kBackwardOp,
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          k::nll_backward<T>(c.X(0)[0], c.I(1), c.Y, c.out[0].dim(0), c.out[0].dim(1));
        },
};

inline constexpr OpDesc kLabelLogProbs = {
    .op = Op::LabelLogProbs,
    .name = "label_log_probs",
    .min_inputs = 2,
    .max_inputs = 2,
    .shape = [](const ShapeCheck& c) -> Types {
      c.need_float(0);
      c.need_i32(1);
      if (c.S(0).size() != 2 || c.S(1) != Shape{c.S(0)[0]})
        c.fail("expects logp [N, V] and labels [N], got " + shape_str(c.S(0)) + " and " +
               shape_str(c.S(1)));
      return {{c.S(1), c.fd}};
    },
    .vjp =
        [](VjpContext& c) {
          Attrs at;
          at.dim0 = int(c.g.shape(c.in[0])[1]);
          c.dx[0] = c.op(Op::LabelLogProbsBackward, {c.dy, c.in[1]}, at);
        },
    .gradcheck =
        [](GradcheckCase& t) {
          Value labels = t.ids("labels", {4}, {2, -100, 0, 4});  // one row ignored
          return t.g.add1(Op::LabelLogProbs, {t.param("logp", {4, 5}, -3, 0), labels});
        },
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          k::label_log_probs<T>(c.X(0), c.I(1), c.Y, c.in[0].dim(0), c.in[0].dim(1));
        },
    // Per-token and per-sequence log-probs (preference losses).
    .keeps_f32 = [](size_t) { return true; },
};

inline constexpr OpDesc kLabelLogProbsBackward = {
    .op = Op::LabelLogProbsBackward,
    .name = "label_log_probs_backward",
    .min_inputs = 2,
    .max_inputs = 2,
    .shape = [](const ShapeCheck& c) -> Types {
      c.need_float(0);
      c.need_i32(1);
      if (c.S(0).size() != 1 || c.S(1) != c.S(0)) c.fail("expects dy [N] and labels [N]");
      if (c.a.dim0 < 1) c.fail("attrs.dim0 must be the vocabulary size");
      return {{Shape{c.S(0)[0], c.a.dim0}, c.fd}};
    },
    .no_vjp = kBackwardOp,
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          k::label_log_probs_backward<T>(c.X(0), c.I(1), c.Y, c.out[0].dim(0), c.out[0].dim(1));
        },
};

// Where a fused head's products run in a plan: a bf16 graph's NF4 head, a bf16 head, or a bf16
// head fake-quantized (QAT), on the CPU's bf16 dot products where they are chosen (the kernels'
// rule: their h holds bf16 values, as a bf16 graph's does).
inline kernels::Bf16HeadProducts bf16_head_products(const Graph& g, bool nf4, bool bf16_weight,
                                                    bool fake_quant = false) {
  using P = kernels::Bf16HeadProducts;
  if (kernels::bf16_matmul_path() != kernels::Bf16MatmulPath::OneDnn) return P::None;
  if (nf4 && g.float_dtype() == DType::BF16) return P::NF4Weight;
  if (!bf16_weight) return P::None;
  return fake_quant ? P::FakeQuantWeight : P::Bf16Weight;
}

// The fused cross-entropy heads' scratch: a chunk's logits; NF4, bf16 and fake-quantized (5
// inputs) heads are formed tile by tile.
inline constexpr auto kFusedCrossEntropyScratch = [](const Graph& g, const Node& n) -> int64_t {
  const int64_t elem = int64_t(dtype_size(g.compute_dtype()));
  const bool nf4 = n.op == Op::FusedNF4LinearCrossEntropy;
  const bool tiled = nf4 || n.inputs.size() == 5 || g.type(n.inputs[1]).dtype == DType::BF16;
  const int64_t D = g.shape(n.inputs[0])[1];
  const int64_t V = nf4 ? n.attrs.shape[0] : g.shape(n.inputs[1])[0];
  const int64_t C = std::max<int64_t>(1, std::min(n.attrs.chunk_rows, g.shape(n.inputs[0])[0]));
  int64_t scratch = kernels::fused_ce_scratch_bytes(
      C, D, V, elem, tiled,
      bf16_head_products(g, nf4, !nf4 && g.type(n.inputs[1]).dtype == DType::BF16,
                         n.inputs.size() == 5));
  if (n.inputs.size() == 5)  // a fake-quantized head's kept Q6_K scales
    scratch += kernels::fake_quant_weight_side_bytes(kernels::FakeQuant(n.attrs.groups), V, D,
                                                     dtype_size(g.type(n.inputs[1]).dtype));
  return scratch;
};

inline constexpr OpDesc kFusedLinearCrossEntropy = {
    .op = Op::FusedLinearCrossEntropy,
    .name = "fused_linear_cross_entropy",
    .min_inputs = 4,
    .max_inputs = 5,
    .shape = [](const ShapeCheck& c) -> Types {
      if (c.S(0).size() != 2 || c.S(1).size() != 2 || c.S(0)[1] != c.S(1)[1])
        c.fail("expects h [N, D] and W [V, D]");
      c.need_i32(2);
      if (c.S(2) != Shape{c.S(0)[0]}) c.fail("labels must be [N]");
      if (c.in.size() == 5) {  // a fake-quantized head
        c.need_i32(4);
        if (c.a.len <= 0 || c.S(1)[1] % c.a.len != 0)
          c.fail("the head's rows of " + std::to_string(c.S(1)[1]) +
                 " are not a whole number of groups of " + std::to_string(c.a.len));
      }
      if (c.a.no_weight_grad) return {{Shape{}, c.fd}, {c.S(0), c.fd}};
      return {{Shape{}, c.fd}, {c.S(0), c.fd}, {c.S(1), c.fd}};
    },
    .no_vjp = kFusedAfterAutodiff,
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          const int64_t N = c.in[0].dim(0), D = c.in[0].dim(1), V = c.in[1].dim(0);
          T* dh = c.out[1].template data<T>();
          T* dW = c.a.no_weight_grad ? nullptr : c.out[2].template data<T>();
          // A fake-quantized head (QAT) while fake quantization is switched on.
          const bool fq = c.in.size() == 5 && c.I(4)[0] != 0;
          const k::FakeQuantSpec spec{k::FakeQuant(c.a.groups), c.a.len};
          if constexpr (std::is_same_v<T, float>) {
            if (c.in[1].dtype() == DType::BF16) {  // a bf16 head, read tile by tile
              const uint16_t* w = c.in[1].template data<uint16_t>();
              c.Y[0] = float(fq ? k::fused_fake_quant_bf16_linear_cross_entropy(
                                      spec, c.X(0), w, c.I(2), c.X(3)[0], N, D, V, c.a.chunk_rows,
                                      dh, dW, c.a.softcap)
                                : k::fused_bf16_linear_cross_entropy(c.X(0), w, c.I(2), c.X(3)[0],
                                                                     N, D, V, c.a.chunk_rows, dh,
                                                                     dW, c.a.softcap));
              return;
            }
          }
          c.Y[0] = T(fq ? k::fused_fake_quant_linear_cross_entropy<T>(
                              spec, c.X(0), c.X(1), c.I(2), c.X(3)[0], N, D, V, c.a.chunk_rows, dh,
                              dW, c.a.softcap)
                        : k::fused_linear_cross_entropy<T>(c.X(0), c.X(1), c.I(2), c.X(3)[0], N, D,
                                                           V, c.a.chunk_rows, dh, dW, c.a.softcap));
        },
    .reads_bf16 = [](const Node&, size_t input) { return input == 1; },  // the head, tile by tile
    .scratch_bytes = kFusedCrossEntropyScratch,
};

inline constexpr OpDesc kFusedNF4LinearCrossEntropy = {
    .op = Op::FusedNF4LinearCrossEntropy,
    .name = "fused_nf4_linear_cross_entropy",
    .min_inputs = 6,
    .max_inputs = 6,
    .shape = [](const ShapeCheck& c) -> Types {
      c.need_float(0);
      c.need_i32(1);
      for (size_t i = 3; i < 6; ++i) c.need_i32(i);
      if (c.a.shape.size() != 2) c.fail("attrs.shape must be the head's [V, D]");
      if (c.S(0).size() != 2 || c.S(0)[1] != c.a.shape[1])
        c.fail("expects h [N, D] for the head " + shape_str(c.a.shape) + ", got " +
               shape_str(c.S(0)));
      if (c.S(1) != Shape{c.S(0)[0]}) c.fail("labels must be [N]");
      if (!c.S(2).empty()) c.fail("the scale must be a scalar");
      return {{Shape{}, c.fd}, {c.S(0), c.fd}};
    },
    .no_vjp = kFusedAfterAutodiff,
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          const k::NF4View w{
              c.I(3),       c.I(4),      reinterpret_cast<const float*>(c.I(5)), float(c.a.scalar),
              c.a.shape[0], c.a.shape[1]};
          c.Y[0] = T(k::fused_nf4_linear_cross_entropy<T>(
              c.X(0), w, c.I(1), c.X(2)[0], c.in[0].dim(0), c.a.chunk_rows,
              c.out[1].template data<T>(), c.a.softcap));
        },
    .scratch_bytes = kFusedCrossEntropyScratch,
};

// The fused log-prob heads' scratch: a chunk's logits, and tiles of an NF4 or bf16 head.
inline constexpr auto kFusedLinearLogProbsScratch = [](const Graph& g, const Node& n) -> int64_t {
  const int64_t elem = int64_t(dtype_size(g.compute_dtype()));
  const bool bwd = n.op == Op::FusedLinearLogProbsBackward;
  const size_t head = bwd ? 4 : 2;
  const bool nf4 = !n.attrs.keep_logits && n.inputs.size() == head + 3;
  const bool tiled = nf4 || g.type(n.inputs[head]).dtype == DType::BF16;
  const int64_t D = g.shape(n.inputs[0])[1];
  const int64_t V = nf4 ? n.attrs.shape[0] : g.shape(n.inputs[head])[0];
  const int64_t C = std::max<int64_t>(1, std::min(n.attrs.chunk_rows, g.shape(n.inputs[0])[0]));
  return kernels::fused_log_probs_scratch_bytes(
      C, D, V, elem, tiled, bwd, n.attrs.no_weight_grad,
      bf16_head_products(g, nf4, !nf4 && g.type(n.inputs[head]).dtype == DType::BF16),
      n.attrs.keep_logits);
};

// The shape rule of FusedLinearLogProbs, FusedLinearLogProbsBackward.
inline constexpr auto kFusedLinearLogProbsShape = [](const ShapeCheck& c) -> Types {
  const bool fwd = c.op == Op::FusedLinearLogProbs;
  const size_t head = fwd ? 2 : 4;    // index of the first head input
  const bool keep = c.a.keep_logits;  // a dense head; the backward's last input is the logits
  const bool nf4 = !keep && c.in.size() == head + 3;
  if (keep && (c.a.no_weight_grad || c.in.size() != head + (fwd ? 1 : 2)))
    c.fail("keep_logits needs a trained dense head (and the backward the forward's logits)");
  c.need_float(0);
  c.need_i32(1);
  Shape w = nf4 ? c.a.shape : c.S(head);
  if (nf4) {
    for (size_t i = head; i < head + 3; ++i) c.need_i32(i);
    if (w.size() != 2) c.fail("attrs.shape must be the NF4 head's [V, D]");
  } else {
    c.need_float(head);
  }
  if (w.size() != 2 || c.S(0).size() != 2 || c.S(0)[1] != w[1])
    c.fail("expects h [N, D] and a head [V, D], got " + shape_str(c.S(0)) + " and " + shape_str(w));
  const Shape rows{c.S(0)[0]};
  if (c.S(1) != rows) c.fail("labels must be [N]");
  if (fwd && c.a.no_weight_grad) return {{rows, c.fd}, {rows, c.fd}, {rows, c.fd}, {c.S(0), c.fd}};
  const Shape logits{c.S(0)[0], w[0]};
  if (keep && c.S(0)[0] > std::max<int64_t>(1, c.a.chunk_rows))
    c.fail("keep_logits needs every row in one chunk");
  if (fwd && keep) return {{rows, c.fd}, {rows, c.fd}, {rows, c.fd}, {logits, c.fd}};
  if (fwd) return {{rows, c.fd}, {rows, c.fd}, {rows, c.fd}};
  c.need_float(2);
  c.need_float(3);
  if (c.S(2) != rows || c.S(3) != rows) c.fail("lse and dlogp must be [N]");
  if (keep && c.S(head + 1) != logits) c.fail("the kept logits must be [N, V]");
  if (nf4 || c.a.no_weight_grad) return {{c.S(0), c.fd}};
  return {{c.S(0), c.fd}, {w, c.fd}};
};

// The kernel of FusedLinearLogProbs, FusedLinearLogProbsBackward.
inline constexpr auto kFusedLinearLogProbsKernel = []<class T>(const KernelArgs<T>& c) {
  const bool fwd = c.n.op == Op::FusedLinearLogProbs;
  const size_t hi = fwd ? 2 : 4;  // the head's first input
  // Kept logits: the forward's output 3, the backward's last input.
  const bool keep = c.a.keep_logits;
  const bool nf4 = !keep && c.in.size() == hi + 3;
  k::NF4View w{};
  k::LogProbHead<T> head;
  head.D = c.in[0].dim(1);
  head.softcap = c.a.softcap;
  if (nf4) {
    w = {c.I(hi),           c.I(hi + 1),  reinterpret_cast<const float*>(c.I(hi + 2)),
         float(c.a.scalar), c.a.shape[0], c.a.shape[1]};
    head.nf4 = &w;
    head.V = c.a.shape[0];
  } else if (c.in[hi].dtype() == DType::BF16) {
    head.bf16 = c.in[hi].template data<uint16_t>();
    head.V = c.in[hi].dim(0);
  } else {
    head.W = c.X(hi);
    head.V = c.in[hi].dim(0);
  }
  if (fwd)
    k::fused_linear_log_probs<T>(c.X(0), c.I(1), head, c.in[0].dim(0), c.a.chunk_rows, c.Y,
                                 c.out[1].template data<T>(), c.out[2].template data<T>(),
                                 c.a.no_weight_grad ? c.out[3].template data<T>() : nullptr,
                                 keep ? c.out[3].template data<T>() : nullptr);
  else if (c.a.no_weight_grad)  // x = E_p[W] of the forward
    k::fused_linear_log_probs_backward_frozen<T>(c.I(1), c.X(0), c.X(3), head, c.in[0].dim(0), c.Y);
  else
    k::fused_linear_log_probs_backward<T>(c.X(0), c.I(1), c.X(2), c.X(3), head, c.in[0].dim(0),
                                          c.a.chunk_rows, c.Y,
                                          c.out.size() > 1 ? c.out[1].template data<T>() : nullptr,
                                          // Overwritten with dz: the backward is its only reader.
                                          keep ? const_cast<T*>(c.X(hi + 1)) : nullptr);
};

inline constexpr OpDesc kFusedLinearLogProbs = {
    .op = Op::FusedLinearLogProbs,
    .name = "fused_linear_log_probs",
    .min_inputs = 3,
    .max_inputs = 5,  // h, labels, then W or an NF4 head's three
    .shape = kFusedLinearLogProbsShape,
    .no_vjp = kFusedAfterAutodiff,
    .kernel = kFusedLinearLogProbsKernel,
    // Per-token log-probs and their softmax statistics.
    .keeps_f32 = [](size_t output) { return output < 3; },
    // A dense head (an NF4 head has 3 inputs), read tile by tile.
    .reads_bf16 = [](const Node& n, size_t input) { return input == 2 && n.inputs.size() == 3; },
    .scratch_bytes = kFusedLinearLogProbsScratch,
};

inline constexpr OpDesc kFusedLinearLogProbsBackward = {
    .op = Op::FusedLinearLogProbsBackward,
    .name = "fused_linear_log_probs_backward",
    .min_inputs = 5,
    .max_inputs = 7,  // x, labels, lse, dlogp, then W (and the kept logits) or an NF4 head's three
    .shape = kFusedLinearLogProbsShape,
    .no_vjp = kBackwardOp,
    .kernel = kFusedLinearLogProbsKernel,
    .reads_bf16 = [](const Node& n, size_t input) { return input == 4 && n.inputs.size() == 5; },
    .scratch_bytes = kFusedLinearLogProbsScratch,
};

// ORPO's log-odds (losses/preference.h): log(1 - p) of a mean log-prob log p.
inline constexpr OpDesc kLog1mExp = {
    .op = Op::Log1mExp,
    .name = "log1mexp",
    .min_inputs = 1,
    .max_inputs = 1,
    .shape = kFloatSameShape,
    .vjp =
        [](VjpContext& c) {
          c.dx[0] = c.op(Op::Log1mExpBackward, {c.in[0], c.dy});
        },
    .gradcheck =  // both sides of -log 2, where the kernel switches formulas
    [](GradcheckCase& t) {
      return t.g.add1(Op::Log1mExp, {t.param("x", {3, 5}, -4, -0.05)});
    },
    .kernel = []<class T>(const KernelArgs<T>& c) { k::log1mexp<T>(c.X(0), c.Y, c.in[0].numel()); },
    .keeps_f32 = [](size_t) { return true; },  // per-sequence preference-loss terms
};

inline constexpr OpDesc kLog1mExpBackward = {
    .op = Op::Log1mExpBackward,
    .name = "log1mexp_backward",
    .min_inputs = 2,
    .max_inputs = 2,
    .shape = kGradSameShape,
    .no_vjp = kBackwardOp,
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          k::log1mexp_backward<T>(c.X(0), c.X(1), c.Y, c.in[0].numel());
        },
    .keeps_f32 = [](size_t) { return true; },
};

// KTO's per-example losses (losses/preference.h).
inline constexpr OpDesc kSigmoid = {
    .op = Op::Sigmoid,
    .name = "sigmoid",
    .min_inputs = 1,
    .max_inputs = 1,
    .shape = kFloatSameShape,
    .vjp =
        [](VjpContext& c) {
          c.dx[0] = c.op(Op::SigmoidBackward, {c.y, c.dy});
        },
    .gradcheck =
        [](GradcheckCase& t) {
          return t.g.add1(Op::Sigmoid, {t.param("x", {3, 5}, -6, 6)});
        },
    .kernel = []<class T>(const KernelArgs<T>& c) { k::sigmoid<T>(c.X(0), c.Y, c.in[0].numel()); },
    .keeps_f32 = [](size_t) { return true; },  // per-sequence preference-loss terms
};

inline constexpr OpDesc kSigmoidBackward = {
    .op = Op::SigmoidBackward,
    .name = "sigmoid_backward",
    .min_inputs = 2,
    .max_inputs = 2,
    .shape = kGradSameShape,
    .no_vjp = kBackwardOp,
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          k::sigmoid_backward<T>(c.X(0), c.X(1), c.Y, c.in[0].numel());
        },
    .keeps_f32 = [](size_t) { return true; },
};

inline constexpr const OpDesc* kLossesOps[] = {&kNll,
                                               &kNllBackward,
                                               &kLabelLogProbs,
                                               &kLabelLogProbsBackward,
                                               &kFusedLinearCrossEntropy,
                                               &kFusedNF4LinearCrossEntropy,
                                               &kFusedLinearLogProbs,
                                               &kFusedLinearLogProbsBackward,
                                               &kLog1mExp,
                                               &kLog1mExpBackward,
                                               &kSigmoid,
                                               &kSigmoidBackward};

}  // namespace fusetune::ops
