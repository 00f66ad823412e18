#pragma once
// Data movement: views, transposes, slices and embedding lookups.
// One entry per op (graph/op_desc.h, docs/design.md §1): to add an op, copy a neighbour's
// entry and list it in the family's ops at the end of this file.
#include <cstring>
#include "fusetune/graph/op_desc.h"
#include "fusetune/kernels/cpu/embedding_rows.h"
#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/kernels/cpu/nf4.h"
#include "fusetune/ops/dims.h"

namespace fusetune::ops {

namespace k = kernels;

inline constexpr OpDesc kReshape = {
    .op = Op::Reshape,
    .name = "reshape",
    .min_inputs = 1,
    .max_inputs = 1,
    .shape = [](const ShapeCheck& c) -> Types {
      if (shape_numel(c.a.shape) != c.T(0).numel())
        c.fail("cannot view " + shape_str(c.S(0)) + " as " + shape_str(c.a.shape));
      return {{c.a.shape, c.T(0).dtype}};
    },
    .vjp = [](VjpContext& c) { c.dx[0] = c.reshape(c.dy, c.g.shape(c.in[0])); },
    .gradcheck =
        [](GradcheckCase& t) {
          Attrs at;
          at.shape = {6, 4};
          return t.g.add1(Op::Reshape, {t.param("x", {2, 3, 4})}, at);
        },
    .kernel =
        Kernel::none("a view of its input: no data moves (runtime/node_kernels.h is_view_op)"),
};

inline constexpr OpDesc kTranspose = {
    .op = Op::Transpose,
    .name = "transpose",
    .min_inputs = 1,
    .max_inputs = 1,
    .shape = [](const ShapeCheck& c) -> Types {
      Shape out = c.S(0);
      int d0 = c.norm_dim(c.a.dim0, out.size()), d1 = c.norm_dim(c.a.dim1, out.size());
      std::swap(out[d0], out[d1]);
      return {{out, c.T(0).dtype}};
    },
    .vjp =
        [](VjpContext& c) {
          Attrs at;
          at.dim0 = c.a.dim0;
          at.dim1 = c.a.dim1;
          c.dx[0] = c.op(Op::Transpose, {c.dy}, at);
        },
    .gradcheck =
        [](GradcheckCase& t) {
          Attrs at;
          at.dim0 = 0;
          at.dim1 = -1;
          return t.g.add1(Op::Transpose, {t.param("x", {2, 3, 4})}, at);
        },
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          const Shape& s = c.in[0].shape();
          size_t r = s.size();
          size_t d0 = size_t(c.a.dim0 < 0 ? c.a.dim0 + int(r) : c.a.dim0);
          size_t d1 = size_t(c.a.dim1 < 0 ? c.a.dim1 + int(r) : c.a.dim1);
          if (d0 > d1) std::swap(d0, d1);
          if (d0 == d1) {
            std::memcpy(c.Y, c.X(0), c.in[0].nbytes());
            return;
          }
          k::transpose<T>(c.X(0), c.Y, prod(s, 0, d0), s[d0], prod(s, d0 + 1, d1), s[d1],
                          prod(s, d1 + 1, r));
        },
};

// The kernel of Slice, SliceBackward.
inline constexpr auto kSliceKernel = []<class T>(const KernelArgs<T>& c) {
  const Shape& full = c.n.op == Op::Slice ? c.in[0].shape() : c.out[0].shape();
  size_t r = full.size();
  size_t d = size_t(c.a.dim0 < 0 ? c.a.dim0 + int(r) : c.a.dim0);
  if (c.n.op == Op::Slice)
    k::slice<T>(c.X(0), c.Y, prod(full, 0, d), full[d], prod(full, d + 1, r), c.a.start, c.a.len);
  else
    k::slice_backward<T>(c.X(0), c.Y, prod(full, 0, d), full[d], prod(full, d + 1, r), c.a.start,
                         c.a.len);
};

inline constexpr OpDesc kSlice = {
    .op = Op::Slice,
    .name = "slice",
    .min_inputs = 1,
    .max_inputs = 1,
    .shape = [](const ShapeCheck& c) -> Types {
      Shape out = c.S(0);
      int d = c.norm_dim(c.a.dim0, out.size());
      if (c.a.start < 0 || c.a.len < 0 || c.a.start + c.a.len > out[d])
        c.fail("range out of bounds");
      out[d] = c.a.len;
      return {{out, c.T(0).dtype}};
    },
    .vjp =
        [](VjpContext& c) {
          Attrs at = c.a;
          at.shape = c.g.shape(c.in[0]);
          c.dx[0] = c.op(Op::SliceBackward, {c.dy}, at);
        },
    .gradcheck =
        [](GradcheckCase& t) {
          Attrs at;
          at.dim0 = 1;
          at.start = 2;
          at.len = 3;
          return t.g.add1(Op::Slice, {t.param("x", {2, 6, 3})}, at);
        },
    .kernel = kSliceKernel,
};

inline constexpr OpDesc kSliceBackward = {
    .op = Op::SliceBackward,
    .name = "slice_backward",
    .min_inputs = 1,
    .max_inputs = 1,
    .shape = [](const ShapeCheck& c) -> Types {
      return {{c.a.shape, c.fd}};
    },
    .no_vjp = kBackwardOp,
    .kernel = kSliceKernel,
};

inline constexpr OpDesc kEmbedding = {
    .op = Op::Embedding,
    .name = "embedding",
    .min_inputs = 2,
    .max_inputs = 2,
    .shape = [](const ShapeCheck& c) -> Types {
      c.need_i32(1);
      if (c.S(0).size() != 2) c.fail("table must be [V, D]");
      Shape out = c.S(1);
      out.push_back(c.S(0)[1]);
      return {{out, c.fd}};
    },
    .vjp =
        [](VjpContext& c) {
          Attrs at;
          at.dim0 = int(c.g.shape(c.in[0])[0]);
          Shape flat{c.g.type(c.in[1]).numel(), c.g.shape(c.in[0])[1]};
          Value dy2 = c.g.shape(c.dy) == flat ? c.dy : c.reshape(c.dy, flat);
          Value ids = c.g.shape(c.in[1]).size() == 1 ? c.in[1] : c.reshape(c.in[1], {flat[0]});
          c.dx[0] = c.op(Op::EmbeddingBackward, {dy2, ids}, at);
        },
    .gradcheck =
        [](GradcheckCase& t) {
          Value ids = t.ids("ids", {2, 3}, {1, 4, 1, 0, 5, 1});  // repeated ids sum
          return t.g.add1(Op::Embedding, {t.param("table", {6, 3}), ids});
        },
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          k::embedding_forward<T>(c.X(0), c.I(1), c.Y, c.in[1].numel(), c.in[0].dim(1),
                                  c.in[0].dim(0));
        },
};

inline constexpr OpDesc kEmbeddingBackward = {
    .op = Op::EmbeddingBackward,
    .name = "embedding_backward",
    .min_inputs = 2,
    .max_inputs = 2,
    .shape = [](const ShapeCheck& c) -> Types {
      c.need_i32(1);
      return {{Shape{c.a.dim0, c.S(0).back()}, c.fd}};
    },
    .no_vjp = kBackwardOp,
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          k::embedding_backward<T>(c.X(0), c.I(1), c.Y, c.in[1].numel(), c.out[0].dim(1),
                                   c.out[0].dim(0), k::embedding_rows_to_clear(c.out[0]));
          k::record_embedding_rows(c.out[0], c.I(1), c.in[1].numel());
        },
};

inline constexpr OpDesc kNF4Embedding = {
    .op = Op::NF4Embedding,
    .name = "nf4_embedding",
    .min_inputs = 4,
    .max_inputs = 4,
    .shape = [](const ShapeCheck& c) -> Types {
      for (size_t i = 0; i < 4; ++i) c.need_i32(i);
      if (c.a.shape.size() != 2) c.fail("attrs.shape must be the table's [V, D]");
      Shape out = c.S(0);
      out.push_back(c.a.shape[1]);
      return {{out, c.fd}};
    },
    .no_vjp = "not differentiable: a frozen NF4 table read with integer ids",
    .kernel =
        []<class T>(const KernelArgs<T>& c) {
          const k::NF4View w{
              c.I(1),       c.I(2),      reinterpret_cast<const float*>(c.I(3)), float(c.a.scalar),
              c.a.shape[0], c.a.shape[1]};
          k::nf4_gather_rows<T>(w, c.I(0), c.in[0].numel(), c.Y);
        },
};

inline constexpr const OpDesc* kDataMovementOps[] = {
    &kReshape,   &kTranspose,         &kSlice,       &kSliceBackward,
    &kEmbedding, &kEmbeddingBackward, &kNF4Embedding};

}  // namespace fusetune::ops
