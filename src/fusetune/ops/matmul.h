#pragma once
// Matrix products: dense, NF4-quantized (QLoRA) and fake-quantized (QAT), and QAT's fake
// quantization itself. One entry per op (graph/op_desc.h, docs/design.md §1): to add an op, copy a
// neighbour's entry and list it in the family's ops at the end of this file.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "fusetune/graph/op_desc.h"
#include "fusetune/kernels/cpu/bf16.h"
#include "fusetune/kernels/cpu/bf16_matmul.h"
#include "fusetune/kernels/cpu/fake_quant.h"
#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/kernels/cpu/nf4.h"
#include "fusetune/kernels/cpu/nf4_bf16_matmul.h"
#include "fusetune/ops/dims.h"

namespace fusetune::ops {

namespace k = kernels;

inline constexpr OpDesc kMatMul = {
    .op = Op::MatMul,
    .name = "matmul",
    .min_inputs = 2,
    .max_inputs = 2,
    .shape = [](const ShapeCheck& c) -> Types {
      c.need_float(0);
      c.need_float(1);
      const Shape &sa = c.S(0), &sb = c.S(1);
      if (sa.size() < 2 || sb.size() < 2) c.fail("operands must have rank >= 2");
      if (sa.size() != sb.size())
        c.fail("operands must have equal rank: " + shape_str(sa) + " x " + shape_str(sb));
      if (!std::equal(sa.begin(), sa.end() - 2, sb.begin()))
        c.fail("batch dims differ: " + shape_str(sa) + " x " + shape_str(sb));
      int64_t m = c.a.trans_a ? sa[sa.size() - 1] : sa[sa.size() - 2];
      int64_t k1 = c.a.trans_a ? sa[sa.size() - 2] : sa[sa.size() - 1];
      int64_t k2 = c.a.trans_b ? sb[sb.size() - 1] : sb[sb.size() - 2];
      int64_t n = c.a.trans_b ? sb[sb.size() - 2] : sb[sb.size() - 1];
      if (k1 != k2)
        c.fail("inner dims differ: " + shape_str(sa) + (c.a.trans_a ? "^T" : "") + " x " +
               shape_str(sb) + (c.a.trans_b ? "^T" : ""));
      Shape out(sa.begin(), sa.end() - 2);
      out.push_back(m);
      out.push_back(n);
      return {{out, c.fd}};
    },
    .vjp =
        [](VjpContext& c) {
          Value A = c.in[0], B = c.in[1];
          Attrs at;
          if (c.need[0]) {
            if (!c.a.trans_a) {
              at.trans_a = false;
              at.trans_b = !c.a.trans_b;
              c.dx[0] = c.op(Op::MatMul, {c.dy, B}, at);
            } else {
              at.trans_a = c.a.trans_b;
              at.trans_b = true;
              c.dx[0] = c.op(Op::MatMul, {B, c.dy}, at);
            }
          }
          if (c.need[1]) {
            if (!c.a.trans_b) {
              at.trans_a = !c.a.trans_a;
              at.trans_b = false;
              c.dx[1] = c.op(Op::MatMul, {A, c.dy}, at);
            } else {
              at.trans_a = true;
              at.trans_b = c.a.trans_a;
              c.dx[1] = c.op(Op::MatMul, {c.dy, A}, at);
            }
          }
        },
    .gradcheck =
        [](GradcheckCase& t) {
          Attrs at;  // both transposed: [4, 3]^T x [5, 4]^T
          at.trans_a = at.trans_b = true;
          return t.g.add1(Op::MatMul, {t.param("a", {4, 3}), t.param("b", {5, 4})}, at);
        },
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          const Shape& sa = c.in[0].shape();
          const Shape& sb = c.in[1].shape();
          const size_t r = sa.size();
          int64_t batch = prod(sa, 0, r - 2);
          int64_t M = c.a.trans_a ? sa[r - 1] : sa[r - 2];
          int64_t K = c.a.trans_a ? sa[r - 2] : sa[r - 1];
          int64_t N = c.a.trans_b ? sb[r - 2] : sb[r - 1];
          if (batch == 1)
            k::gemm<T>(c.a.trans_a, c.a.trans_b, M, N, K, T(1), c.X(0), sa[r - 1], c.X(1),
                       sb[r - 1], T(0), c.Y, N);
          else
            k::gemm_batched<T>(batch, c.a.trans_a, c.a.trans_b, M, N, K, T(1), c.X(0), M * K,
                               c.X(1), K * N, T(0), c.Y, M * N);
        },
};

// The NF4 weight, dequantized a tile of rows at a time (in a bf16 graph on bf16 dot products,
// also rounded to bf16 with the activations: nf4_bf16_matmul.h).
inline constexpr auto kNF4MatMulScratch = [](const Graph& g, const Node& n) -> int64_t {
  const int64_t rows = n.attrs.shape[0], cols = n.attrs.shape[1];
  if (g.float_dtype() == DType::BF16 &&
      kernels::bf16_matmul_path() == kernels::Bf16MatmulPath::OneDnn)
    return kernels::nf4_matmul_bf16_scratch_bytes(g.shape(n.inputs[0])[0], rows, cols,
                                                  n.op == Op::NF4MatMulBackward);
  const int64_t elem = int64_t(dtype_size(g.compute_dtype()));
  return kernels::nf4_tile_rows(rows, cols) * cols * elem;
};

// The shape rule of NF4MatMul, NF4MatMulBackward.
inline constexpr auto kNF4MatMulShape = [](const ShapeCheck& c) -> Types {
  c.need_float(0);
  for (size_t i = 1; i < 4; ++i) c.need_i32(i);
  if (c.a.shape.size() != 2) c.fail("attrs.shape must be the weight's [O, K]");
  const bool fwd = c.op == Op::NF4MatMul;
  const int64_t in_dim = fwd ? c.a.shape[1] : c.a.shape[0],
                out_dim = fwd ? c.a.shape[0] : c.a.shape[1];
  if (c.S(0).size() != 2 || c.S(0)[1] != in_dim)
    c.fail("input " + shape_str(c.S(0)) + " does not match the weight " + shape_str(c.a.shape));
  return {{Shape{c.S(0)[0], out_dim}, c.fd}};
};

// The kernel of NF4MatMul, NF4MatMulBackward.
inline constexpr auto kNF4MatMulKernel = []<class T>(const KernelArgs<T>& c) {
  k::NF4View w{c.I(1),       c.I(2),      reinterpret_cast<const float*>(c.I(3)), float(c.a.scalar),
               c.a.shape[0], c.a.shape[1]};
  if (c.n.op == Op::NF4MatMul)
    k::nf4_matmul<T>(w, c.X(0), c.in[0].dim(0), c.Y);
  else
    k::nf4_matmul_backward<T>(w, c.X(0), c.in[0].dim(0), c.Y);
};

inline constexpr OpDesc kNF4MatMul = {
    .op = Op::NF4MatMul,
    .name = "nf4_matmul",
    .min_inputs = 4,
    .max_inputs = 4,
    .shape = kNF4MatMulShape,
    .vjp =
        [](VjpContext& c) {
          c.dx[0] = c.op(Op::NF4MatMulBackward, {c.dy, c.in[1], c.in[2], c.in[3]}, c.a);
        },
    .gradcheck =
        [](GradcheckCase& t) {
          // x [3, 8] times a fixed NF4 weight [4, 8]^T; only x has a gradient.
          const int64_t O = 4, K = 8;
          const k::NF4Sizes s = k::nf4_sizes(O * K);
          std::vector<double> w(size_t(O * K));
          for (size_t i = 0; i < w.size(); ++i) w[i] = std::sin(double(i) * 0.7);
          Tensor codes = Tensor::empty({s.code_words}, DType::I32);
          Tensor absmax_codes = Tensor::empty({s.absmax_words}, DType::I32);
          Tensor scales = Tensor::empty({s.scales}, DType::I32);
          float offset = 0;
          k::nf4_quantize(w.data(), O * K, codes.data<int32_t>(), absmax_codes.data<int32_t>(),
                          reinterpret_cast<float*>(scales.data<int32_t>()), &offset);
          Attrs at;
          at.shape = {O, K};
          at.scalar = offset;
          return t.g.add1(
              Op::NF4MatMul,
              {t.param("x", {3, K}), t.g.constant(codes, "codes"),
               t.g.constant(absmax_codes, "absmax_codes"), t.g.constant(scales, "scales")},
              at);
        },
    .kernel = kNF4MatMulKernel,
    .scratch_bytes = kNF4MatMulScratch,
};

inline constexpr OpDesc kNF4MatMulBackward = {
    .op = Op::NF4MatMulBackward,
    .name = "nf4_matmul_backward",
    .min_inputs = 4,
    .max_inputs = 4,
    .shape = kNF4MatMulShape,
    .no_vjp = kBackwardOp,
    .kernel = kNF4MatMulKernel,
    .scratch_bytes = kNF4MatMulScratch,
};

// The shape rule of FakeQuantize, FakeQuantizeBackward.
inline constexpr auto kFakeQuantizeShape = [](const ShapeCheck& c) -> Types {
  const bool fwd = c.op == Op::FakeQuantize;
  c.need_float(0);
  if (!fwd) {
    c.need_float(1);
    if (c.S(1) != c.S(0)) c.fail("dy must have x's shape " + shape_str(c.S(0)));
  }
  c.need_i32(fwd ? 1 : 2);
  if (c.S(0).empty() || c.a.len <= 0 || c.S(0).back() % c.a.len != 0)
    c.fail("the last dim of " + shape_str(c.S(0)) + " is not a whole number of groups of " +
           std::to_string(c.a.len));
  return {{c.S(0), c.fd}};
};

// The kernel of FakeQuantize, FakeQuantizeBackward.
inline constexpr auto kFakeQuantizeKernel = []<class T>(const KernelArgs<T>& c) {
  const bool fwd = c.n.op == Op::FakeQuantize;
  const k::FakeQuantSpec spec{k::FakeQuant(c.a.groups), c.a.len};
  const int64_t cols = c.in[0].shape().back(), rows = c.in[0].numel() / std::max<int64_t>(1, cols);
  const T* src = c.X(fwd ? 0 : 1);
  if (c.I(fwd ? 1 : 2)[0] == 0) {  // fake quantization off: identity, plain gradient
    if (c.Y != src) std::copy(src, src + c.out[0].numel(), c.Y);
  } else if (fwd) {
    k::fake_quantize_rows<T>(spec, c.X(0), c.Y, rows, cols);
  } else {
    k::fake_quantize_backward<T>(spec, c.X(0), c.X(1), c.Y, rows, cols);
  }
};

inline constexpr OpDesc kFakeQuantize = {
    .op = Op::FakeQuantize,
    .name = "fake_quantize",
    .min_inputs = 2,
    .max_inputs = 2,
    .shape = kFakeQuantizeShape,
    .vjp =
        [](VjpContext& c) {  // the straight-through estimator: dy, masked when attrs.inverse
          c.dx[0] =
              c.a.inverse ? c.op(Op::FakeQuantizeBackward, {c.in[0], c.dy, c.in[1]}, c.a) : c.dy;
        },
    .gradcheck =
        [](GradcheckCase& t) {
          // Switched off (enable = 0) it is the identity, whose derivative the STE gradient is.
          Attrs at;
          at.groups = int64_t(k::FakeQuant::Int4Symmetric);
          at.len = 4;
          return t.g.add1(Op::FakeQuantize, {t.param("x", {3, 8}), t.ids("enable", {}, {0})}, at);
        },
    .kernel = kFakeQuantizeKernel,
    // kernels/cpu/fake_quant.cpp: a group's statistics are read before any of it is written.
    .in_place = InPlace::FirstInput,
};

inline constexpr OpDesc kFakeQuantizeBackward = {
    .op = Op::FakeQuantizeBackward,
    .name = "fake_quantize_backward",
    .min_inputs = 3,
    .max_inputs = 3,
    .shape = kFakeQuantizeShape,
    .no_vjp = kBackwardOp,
    .kernel = kFakeQuantizeKernel,
    .in_place = InPlace::SecondInput,  // dx[i] from x's group (read into scratch) and dy[i]
};

// The fake-quantized tile of W and the scheme's kept scales; before fake quantization starts,
// a bf16 weight goes through gemm_bf16_weight's tile.
inline constexpr auto kFakeQuantMatMulScratch = [](const Graph& g, const Node& n) -> int64_t {
  const int64_t elem = int64_t(dtype_size(g.compute_dtype()));
  const Shape& w = g.shape(n.inputs[1]);
  int64_t scratch =
      kernels::fake_quant_tile_rows(w[0], w[1]) * w[1] * elem +
      kernels::fake_quant_weight_side_bytes(kernels::FakeQuant(n.attrs.groups), w[0], w[1],
                                            dtype_size(g.type(n.inputs[1]).dtype));
  if (g.type(n.inputs[1]).dtype == DType::BF16) {
    const bool fwd = n.op == Op::FakeQuantMatMul;
    scratch = std::max(scratch, kernels::bf16_weight_tile_rows(fwd, w[0], w[1]) * w[1] * 4);
  }
  return scratch;
};

// The shape rule of FakeQuantMatMul, FakeQuantMatMulBackward.
inline constexpr auto kFakeQuantMatMulShape = [](const ShapeCheck& c) -> Types {
  c.need_float(0);
  c.need_float(1);
  c.need_i32(2);
  if (c.S(1).size() != 2) c.fail("W must be a matrix [O, K], got " + shape_str(c.S(1)));
  const bool fwd = c.op == Op::FakeQuantMatMul;
  const int64_t in_dim = fwd ? c.S(1)[1] : c.S(1)[0], out_dim = fwd ? c.S(1)[0] : c.S(1)[1];
  if (c.S(0).size() != 2 || c.S(0)[1] != in_dim)
    c.fail("input " + shape_str(c.S(0)) + " does not match the weight " + shape_str(c.S(1)));
  if (c.a.len <= 0 || c.S(1)[1] % c.a.len != 0)
    c.fail("the weight's rows of " + std::to_string(c.S(1)[1]) +
           " are not a whole number of groups of " + std::to_string(c.a.len));
  return {{Shape{c.S(0)[0], out_dim}, c.fd}};
};

// The kernel of FakeQuantMatMul, FakeQuantMatMulBackward.
inline constexpr auto kFakeQuantMatMulKernel = []<class T>(const KernelArgs<T>& c) {
  const bool fwd = c.n.op == Op::FakeQuantMatMul;
  const k::FakeQuantSpec spec{k::FakeQuant(c.a.groups), c.a.len};
  const int64_t N = c.in[0].dim(0), O = c.in[1].dim(0), K = c.in[1].dim(1);
  const bool on = c.I(2)[0] != 0;
  if constexpr (std::is_same_v<T, float>) {
    if (c.in[1].dtype() == DType::BF16) {  // a bf16 weight, widened tile by tile
      const uint16_t* w = c.in[1].template data<uint16_t>();
      if (fwd && on)
        k::fake_quant_matmul_bf16(spec, w, c.X(0), N, O, K, c.Y);
      else if (on)
        k::fake_quant_matmul_backward_bf16(spec, w, c.X(0), N, O, K, c.Y);
      else if (fwd)
        k::gemm_bf16_weight(true, N, O, K, c.X(0), w, c.Y);
      else
        k::gemm_bf16_weight(false, N, K, O, c.X(0), w, c.Y);
      return;
    }
  }
  if (fwd && on)
    k::fake_quant_matmul<T>(spec, c.X(1), c.X(0), N, O, K, c.Y);
  else if (on)
    k::fake_quant_matmul_backward<T>(spec, c.X(1), c.X(0), N, O, K, c.Y);
  else if (fwd)
    k::gemm<T>(false, true, N, O, K, T(1), c.X(0), K, c.X(1), K, T(0), c.Y, O);
  else
    k::gemm<T>(false, false, N, K, O, T(1), c.X(0), O, c.X(1), K, T(0), c.Y, K);
};

inline constexpr OpDesc kFakeQuantMatMul = {
    .op = Op::FakeQuantMatMul,
    .name = "fake_quant_matmul",
    .min_inputs = 3,
    .max_inputs = 3,
    .shape = kFakeQuantMatMulShape,
    .vjp =
        [](VjpContext& c) {
          if (c.need[0]) c.dx[0] = c.op(Op::FakeQuantMatMulBackward, {c.dy, c.in[1], c.in[2]}, c.a);
          if (c.need[1]) {  // dW = STE(dy^T x)
            Attrs at;
            at.trans_a = true;
            Value dw = c.op(Op::MatMul, {c.dy, c.in[0]}, at);
            c.dx[1] =
                c.a.inverse ? c.op(Op::FakeQuantizeBackward, {c.in[1], dw, c.in[2]}, c.a) : dw;
          }
        },
    .gradcheck =
        [](GradcheckCase& t) {
          // Switched off (enable = 0): x W^T, whose derivatives the STE gradients are.
          Attrs at;
          at.groups = int64_t(k::FakeQuant::Int4Symmetric);
          at.len = 4;
          return t.g.add1(Op::FakeQuantMatMul,
                          {t.param("x", {3, 8}), t.param("w", {5, 8}), t.ids("enable", {}, {0})},
                          at);
        },
    .kernel = kFakeQuantMatMulKernel,
    .reads_bf16 = [](const Node&,
                     size_t input) { return input == 1; },  // W, a tile of rows at a time
    .scratch_bytes = kFakeQuantMatMulScratch,
};

inline constexpr OpDesc kFakeQuantMatMulBackward = {
    .op = Op::FakeQuantMatMulBackward,
    .name = "fake_quant_matmul_backward",
    .min_inputs = 3,
    .max_inputs = 3,
    .shape = kFakeQuantMatMulShape,
    .no_vjp = kBackwardOp,
    .kernel = kFakeQuantMatMulKernel,
    .reads_bf16 = [](const Node&,
                     size_t input) { return input == 1; },  // W, a tile of rows at a time
    .scratch_bytes = kFakeQuantMatMulScratch,
};

inline constexpr const OpDesc* kMatmulOps[] = {&kMatMul,
                                               &kNF4MatMul,
                                               &kNF4MatMulBackward,
                                               &kFakeQuantize,
                                               &kFakeQuantizeBackward,
                                               &kFakeQuantMatMul,
                                               &kFakeQuantMatMulBackward};

}  // namespace fusetune::ops
