// Copy elimination: transposes read through MatMul flags, cancelling and identity transposes,
// each rule on hand-built graphs against eager, and the pass on training graphs.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "fusetune/compile/dead_code.h"
#include "fusetune/compile/eliminate_copies.h"
#include "fusetune/compile/memory_plan.h"
#include "fusetune/graph/autodiff.h"
#include "fusetune/graph/builder.h"
#include "fusetune/graph/verifier.h"
#include "fusetune/models/parameters.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/runtime/plan_executor.h"
#include "graph_compare.h"
#include "tiny_models.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace {

// Runs the pass on a copy of g; checks every output (and the gradients, when `loss` is valid)
// against eager on the original.
Graph check_eliminate_copies(Graph g, const TensorMap& in, const TensorMap& params,
                             Value loss = {}) {
  if (loss.valid()) append_backward(g, loss);
  auto ref = EagerExecutor(g).run(in, params);
  Graph f = g;
  passes::eliminate_copies::run(f, PassOptions{});
  verify_graph(f);
  auto out = EagerExecutor(f).run(in, params);
  auto planned = PlanExecutor(f, plan_memory(f)).run(in, params);
  EXPECT_EQ(out.size(), ref.size());
  for (size_t k = 0; k < ref.size(); ++k) {
    EXPECT_LE(max_rel_diff(out[k], ref[k]), 1e-14) << g.outputs()[k].first;
    EXPECT_LE(max_rel_diff(planned[k], ref[k]), 1e-14) << g.outputs()[k].first;
  }
  return f;
}

}  // namespace

TEST(EliminateCopies, TransposedMatMulOperandsBecomeFlags) {
  Graph g(DType::F64);
  Builder b(g);
  Value a = g.param("a", {2, 5, 3}, true);  // read as a^T [2, 3, 5]
  Value w = g.param("w", {2, 4, 5}, true);  // read as w^T [2, 5, 4]... and transposed again
  Value y = b.matmul(b.transpose(a, 1, 2), b.transpose(w, -1, -2));               // [2, 3, 4]
  Value z = b.matmul(b.transpose(a, -2, -1), b.transpose(a, 2, 1), true, false);  // [2,5,5]
  Value loss = b.add(b.sum(y), b.sum(z));
  g.mark_output("loss", loss);
  TensorMap params{{"a", random_tensor({2, 5, 3}, DType::F64, 1)},
                   {"w", random_tensor({2, 4, 5}, DType::F64, 2)}};
  Graph f = check_eliminate_copies(g, {}, params, loss);
  // The forward transposes are gone; the backward's (transposes of MatMul results) became
  // MatMuls with swapped operands.
  EXPECT_EQ(count_ops(f, Op::Transpose), 0);
  Graph full = g;
  append_backward(full, loss);
  EXPECT_GT(count_ops(full, Op::Transpose), 4);
  EXPECT_EQ(count_ops(f, Op::MatMul), count_ops(full, Op::MatMul));
}

TEST(EliminateCopies, CancellingAndIdentityTransposesDisappear) {
  Graph g(DType::F64);
  Builder b(g);
  Value x = g.param("x", {2, 3, 4, 5}, true);
  Value tt = b.transpose(b.transpose(x, 1, 2), 2, 1);     // x
  Value id = b.transpose(b.silu(x), 3, -1);               // swap a dim with itself: identity
  Value kept = b.transpose(x, 0, 2);                      // a real copy stays
  Value other = b.transpose(b.transpose(x, 1, 2), 1, 3);  // not the same pair: both stay
  Value loss = b.add(b.add(b.sum(b.mul(tt, x)), b.sum(id)),
                     b.add(b.sum(b.silu(kept)), b.sum(b.silu(other))));
  g.mark_output("loss", loss);
  TensorMap params{{"x", random_tensor({2, 3, 4, 5}, DType::F64, 3)}};
  Graph forward = g;
  Graph f = check_eliminate_copies(g, {}, params, loss);
  Graph ff = forward;
  passes::eliminate_copies::run(ff, PassOptions{});
  EXPECT_EQ(count_ops(ff, Op::Transpose), 3);  // kept, and other's two
}

TEST(EliminateCopies, BatchDimTransposeAndSharedTransposeStay) {
  Graph g(DType::F64);
  Builder b(g);
  Value a = g.param("a", {3, 2, 4}, true);
  Value c = g.param("c", {2, 4, 5}, true);
  Value ta = b.transpose(a, 0, 1);  // [2, 3, 4]: a batch dim moves, not a flag
  Value y = b.matmul(ta, c);        // [2, 3, 5]
  Value s = g.param("s", {2, 4, 3}, true);
  Value ts = b.transpose(s, 1, 2);  // [2, 3, 4], also read by silu: stays for that reader
  Value y2 = b.matmul(ts, c);
  Value loss = b.add(b.add(b.sum(y), b.sum(y2)), b.sum(b.silu(ts)));
  g.mark_output("loss", loss);
  TensorMap params{{"a", random_tensor({3, 2, 4}, DType::F64, 4)},
                   {"c", random_tensor({2, 4, 5}, DType::F64, 5)},
                   {"s", random_tensor({2, 4, 3}, DType::F64, 6)}};
  Graph fwd = g;
  check_eliminate_copies(g, {}, params, loss);
  passes::eliminate_copies::run(fwd, PassOptions{});
  int flagged = 0, transposes = 0;
  for (const Node& n : fwd.nodes()) {
    flagged += n.op == Op::MatMul && n.attrs.trans_a;
    transposes += n.op == Op::Transpose;
  }
  EXPECT_EQ(flagged, 1);
  EXPECT_EQ(transposes, 2);  // ta (batch dims) and ts (still read by silu)
}

TEST(EliminateCopies, TrainingGraphMatchesEager) {
  ModelConfig cfg = tiny_config(false, true);
  cfg.vocab_size = 37;
  TrainingGraphOptions o;
  o.batch_size = 2;
  o.seq_len = 8;
  o.dtype = DType::F64;
  TrainingGraph tg = build_training_graph(cfg, o);
  TensorMap params = init_parameters(graph_parameters(tg.graph), 11, DType::F64, 0.2);
  Batch batch = random_batch(2, 8, cfg.vocab_size, 5);
  TensorMap inputs = batch_inputs(batch, DType::F64, 1.0 / double(batch.num_valid_labels()));
  auto ref = EagerExecutor(tg.graph).run(inputs, params);
  Graph f = tg.graph;
  passes::dead_code::run(f, PassOptions{});
  passes::eliminate_copies::run(f, PassOptions{});
  verify_graph(f);
  auto out = PlanExecutor(f, plan_memory(f)).run(inputs, params);
  for (size_t k = 0; k < out.size(); ++k)
    EXPECT_LE(max_rel_diff(out[k], ref[k]), 1e-12) << tg.graph.outputs()[k].first;
}
