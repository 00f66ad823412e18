// The attention fusion pass on its own against eager, on the tiny models (GQA, MQA, tied head,
// qkv bias, packed documents, frozen parts), and what the compiled graph no longer holds.
#include <gtest/gtest.h>

#include <cmath>

#include "fusetune/compile/compiler.h"
#include "fusetune/compile/fuse_attention.h"
#include "fusetune/compile/plan_report.h"
#include "fusetune/graph/builder.h"
#include "fusetune/graph/verifier.h"
#include "fusetune/models/parameters.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/runtime/eager_executor.h"
#include "graph_compare.h"
#include "tiny_models.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace {

struct AttentionCase {
  const char* name;
  bool tied, bias, packed;
  int64_t kv, seq;
};

const AttentionCase kAttentionCases[] = {
    {"gqa_untied", false, false, false, 2, 8},
    {"gqa_tied_bias_long", true, true, false, 2, 150},  // several tiles, ragged last tile
    {"mha_packed", false, false, true, 4, 8},
    {"mqa_tied_packed_long", true, false, true, 1, 140},
};

ModelConfig config_for(const AttentionCase& c) {
  ModelConfig cfg = tiny_config(c.tied, c.bias, c.kv);
  cfg.vocab_size = 37;
  cfg.max_position_embeddings = 256;
  return cfg;
}

TrainingGraph attention_graph_for(
    const AttentionCase& c, DType dt,
    TrainablePredicate trainable = [](const std::string&) { return true; }) {
  TrainingGraphOptions o;
  o.batch_size = 2;
  o.seq_len = c.seq;
  o.packed = c.packed;
  o.dtype = dt;
  o.trainable = std::move(trainable);
  return build_training_graph(config_for(c), o);
}

// Runs `g` and the rewritten `fused` eagerly on the same step and compares every output.
void expect_same_step(const AttentionCase& c, const Graph& g, const Graph& fused, DType dt,
                      double loss_tol, double grad_tol) {
  TensorMap params = init_parameters(graph_parameters(g), 11, dt, 0.2);
  Batch batch = random_batch(2, c.seq, 37, 5, c.packed);
  TensorMap inputs = batch_inputs(batch, dt, 1.0 / double(batch.num_valid_labels()));
  auto ref = EagerExecutor(g).run(inputs, params);
  auto out = EagerExecutor(fused).run(inputs, params);
  ASSERT_EQ(out.size(), ref.size());
  EXPECT_LE(max_rel_diff(out[0], ref[0]), loss_tol) << c.name << " loss";
  for (size_t k = 1; k < out.size(); ++k)
    EXPECT_LE(max_rel_diff(out[k], ref[k]), grad_tol) << c.name << " " << g.outputs()[k].first;
}

void check_pass_alone(DType dt, double loss_tol, double grad_tol) {
  for (const AttentionCase& c : kAttentionCases) {
    TrainingGraph tg = attention_graph_for(c, dt);
    Graph g = tg.graph;
    const std::string line = passes::fuse_attention::run(g, PassOptions{});
    EXPECT_EQ(line, "fuse_attention: fused 2 (2 with their backward)") << c.name;
    verify_graph(g);
    EXPECT_EQ(count_ops(g, Op::FlashAttention), 2) << c.name;
    EXPECT_EQ(count_ops(g, Op::FlashAttentionBackward), 2) << c.name;
    expect_same_step(c, tg.graph, g, dt, loss_tol, grad_tol);
  }
}

}  // namespace

TEST(CompileFuseAttention, PassAloneMatchesEagerInFloat64) {
  check_pass_alone(DType::F64, 1e-12, 1e-10);
}

TEST(CompileFuseAttention, PassAloneMatchesEagerInFloat32) {
  check_pass_alone(DType::F32, 1e-5, 1e-4);
}

TEST(CompileFuseAttention, CompiledGraphHoldsNoScoresSoftmaxOrRepeatedHeads) {
  for (const AttentionCase& c : kAttentionCases) {
    TrainingGraph tg = attention_graph_for(c, DType::F32);
    EXPECT_EQ(count_ops(tg.graph, Op::Softmax), 2);
    for (CompileMode mode : {CompileMode::Model, CompileMode::Full}) {
      PassOptions po;
      po.mode = mode;
      Graph g = run_passes(tg.graph, po, nullptr);
      for (Op op : {Op::Softmax, Op::SoftmaxBackward, Op::RepeatHeads, Op::RepeatHeadsBackward,
                    Op::CausalMask, Op::CausalMaskBackward, Op::Transpose})
        EXPECT_EQ(count_ops(g, op), 0) << c.name << " " << op_name(op);
      const Shape scores{2, 4, c.seq, c.seq};
      for (const Node& n : g.nodes())
        for (const auto& t : n.outputs)
          EXPECT_NE(t.shape, scores) << c.name << " " << op_name(n.op);
      EXPECT_EQ(count_ops(g, Op::FlashAttention), 2);
      EXPECT_EQ(count_ops(g, Op::FlashAttentionBackward), 2);
      // Each fused node keeps its layer and direction (activation checkpointing relies on it).
      for (const Node& n : g.nodes())
        if (n.op == Op::FlashAttention || n.op == Op::FlashAttentionBackward) {
          EXPECT_GE(n.layer, 0);
          EXPECT_EQ(n.backward, n.op == Op::FlashAttentionBackward);
          EXPECT_EQ(n.region, 0);
        }
    }
  }
}

TEST(CompileFuseAttention, FrozenProjectionsLeaveSomeGradientsOut) {
  // Only v_proj and the MLP train: layer 0's q and k need no gradient (their inputs are frozen
  // embeddings), so autodiff emitted no dq/dk chain there; the pass still fuses.
  const AttentionCase c{"frozen_qk", false, true, true, 2, 70};
  auto trainable = [](const std::string& n) {
    return n.find("v_proj") != std::string::npos || n.find("mlp") != std::string::npos;
  };
  TrainingGraph tg = attention_graph_for(c, DType::F64, trainable);
  Graph g = tg.graph;
  passes::fuse_attention::run(g, PassOptions{});
  EXPECT_EQ(count_ops(g, Op::FlashAttention), 2);
  EXPECT_EQ(count_ops(g, Op::FlashAttentionBackward), 2);
  EXPECT_EQ(count_ops(g, Op::Softmax), 0);
  expect_same_step(c, tg.graph, g, DType::F64, 1e-12, 1e-10);
}

TEST(CompileFuseAttention, ForwardOnlyGraphFusesTheForward) {
  ModelConfig cfg = config_for(kAttentionCases[0]);
  Graph g = build_logits_graph(cfg, 2, 90, DType::F64);
  Graph fused = g;
  EXPECT_EQ(passes::fuse_attention::run(fused, PassOptions{}),
            "fuse_attention: fused 2 (0 with their backward)");
  EXPECT_EQ(count_ops(fused, Op::FlashAttention), 2);
  EXPECT_EQ(count_ops(fused, Op::FlashAttentionBackward), 0);
  EXPECT_EQ(count_ops(fused, Op::Softmax), 0);
  TensorMap params = init_parameters(graph_parameters(g), 3, DType::F64, 0.3);
  Batch batch = random_batch(2, 90, cfg.vocab_size, 2);
  TensorMap inputs = batch_inputs(batch, DType::F64, 1.0);
  auto ref = EagerExecutor(g).run(inputs, params);
  auto out = EagerExecutor(fused).run(inputs, params);
  EXPECT_LE(max_rel_diff(out[0], ref[0]), 1e-12);
}

TEST(CompileFuseAttention, LeavesInexactMatchesAndUncompiledRegionsAlone) {
  // The probabilities are also a graph output: fusing would lose them, so nothing changes.
  {
    Graph g(DType::F64);
    Builder b(g);
    Value q = g.param("q", {1, 5, 2, 4}, true), k = g.param("k", {1, 5, 1, 4}, true);
    Value v = g.param("v", {1, 5, 1, 4}, true);
    Value qt = b.transpose(q, 1, 2);
    Value kt = b.repeat_heads(b.transpose(k, 1, 2), 2);
    Value vt = b.repeat_heads(b.transpose(v, 1, 2), 2);
    Value probs = b.softmax(b.causal_mask(b.scale(b.matmul(qt, kt, false, true), 0.5)));
    Value o = b.transpose(b.matmul(probs, vt), 1, 2);
    g.mark_output("o", o);
    Graph plain = g;  // the same graph without the extra output fuses
    EXPECT_EQ(passes::fuse_attention::run(plain, PassOptions{}),
              "fuse_attention: fused 1 (0 with their backward)");
    g.mark_output("probs", probs);
    Graph fused = g;
    EXPECT_EQ(passes::fuse_attention::run(fused, PassOptions{}), "fuse_attention: no match");
    EXPECT_EQ(fused.nodes().size(), g.nodes().size());
  }
  // No scale between the matmul and the mask: not the pattern.
  {
    Graph g(DType::F64);
    Builder b(g);
    Value q = g.param("q", {1, 5, 2, 4}, true), v = g.param("v", {1, 5, 2, 4}, true);
    Value qt = b.transpose(q, 1, 2), vt = b.transpose(v, 1, 2);
    Value probs = b.softmax(b.causal_mask(b.matmul(qt, vt, false, true)));
    g.mark_output("o", b.transpose(b.matmul(probs, vt), 1, 2));
    Graph fused = g;
    EXPECT_EQ(passes::fuse_attention::run(fused, PassOptions{}), "fuse_attention: no match");
    EXPECT_EQ(fused.nodes().size(), g.nodes().size());
  }
  // Attention in a region above max_region (compile: model compiles region 0 only).
  {
    TrainingGraph tg = attention_graph_for(kAttentionCases[0], DType::F32);
    Graph g = tg.graph;
    for (Node& n : g.mutable_nodes()) n.region = 1;
    PassOptions model;
    model.mode = CompileMode::Model;
    EXPECT_EQ(passes::fuse_attention::run(g, model), "fuse_attention: no match");
    EXPECT_EQ(count_ops(g, Op::Softmax), 2);
  }
}

TEST(CompileFuseAttention, WorksWithActivationCheckpointing) {
  const AttentionCase c{"ckpt", false, true, true, 2, 70};
  TrainingGraph tg = attention_graph_for(c, DType::F64);
  for (CompileMode mode : {CompileMode::Model, CompileMode::Full}) {
    PassOptions po;
    po.mode = mode;
    po.activation_checkpointing = true;
    std::vector<std::string> report;
    Graph g = run_passes(tg.graph, po, &report);
    EXPECT_NE(report.back().find("2 layers"), std::string::npos) << report.back();
    // The forward once in the forward pass and once recomputed before each layer's backward.
    EXPECT_EQ(count_ops(g, Op::FlashAttention), 4);
    EXPECT_EQ(count_ops(g, Op::FlashAttentionBackward), 2);
    expect_same_step(c, tg.graph, g, DType::F64, 1e-12, 1e-10);
    TensorMap params = init_parameters(graph_parameters(tg.graph), 11, DType::F64, 0.2);
    Batch batch = random_batch(2, c.seq, 37, 5, c.packed);
    TensorMap inputs = batch_inputs(batch, DType::F64, 1.0 / double(batch.num_valid_labels()));
    auto ref = EagerExecutor(tg.graph).run(inputs, params);
    auto out = compile_graph(tg.graph, po).executor->run(inputs, params);
    for (size_t k = 0; k < out.size(); ++k)
      EXPECT_LE(max_rel_diff(out[k], ref[k]), 1e-10) << tg.graph.outputs()[k].first;
  }
}

TEST(CompileFuseAttention, PlanReportShowsTheFusedKernels) {
  TrainingGraph tg = attention_graph_for(kAttentionCases[2], DType::F32);
  PassOptions po;
  const std::string text = format_mode_plan(plan_mode(tg.graph, po, 2.0));
  EXPECT_NE(text.find("pass fuse_attention: fused 2"), std::string::npos) << text;
  EXPECT_NE(text.find("fused flash_attention: q [2, 8, 4, 4], k/v [2, 8, 4, 4]"), std::string::npos)
      << text;
  EXPECT_NE(text.find("doc mask"), std::string::npos) << text;
  EXPECT_NE(text.find("fused flash_attention_backward"), std::string::npos) << text;
  PassOptions eager;
  eager.mode = CompileMode::None;
  EXPECT_EQ(format_mode_plan(plan_mode(tg.graph, eager, 2.0)).find("flash_attention"),
            std::string::npos);
}
