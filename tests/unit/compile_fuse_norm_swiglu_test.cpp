// The SwiGLU and RMSNorm+residual fusion passes: each on its own and in the pipeline computes
// what eager computes (loss and every gradient, float32 and float64), the MLP has no Silu left,
// silu(g) and silu(g)*u are no longer saved for the backward, the fused nodes are counted,
// activation checkpointing and LoRA graphs still work, and graphs that do not match are left
// alone.
#include <gtest/gtest.h>

#include <cmath>

#include "fusetune/compile/compiler.h"
#include "fusetune/compile/fuse_rmsnorm_residual.h"
#include "fusetune/compile/fuse_swiglu.h"
#include "fusetune/compile/memory_estimate.h"
#include "fusetune/compile/memory_plan.h"
#include "fusetune/compile/rewrite.h"
#include "fusetune/graph/autodiff.h"
#include "fusetune/graph/verifier.h"
#include "fusetune/models/parameters.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/peft/lora.h"
#include "fusetune/runtime/eager_executor.h"
#include "fusetune/runtime/plan_executor.h"
#include "gradcheck.h"
#include "graph_compare.h"
#include "tiny_models.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace {

constexpr int64_t kB = 2, kT = 8;

struct Step {
  ModelConfig cfg;
  TrainingGraph tg;
  TensorMap params, inputs;
  std::vector<Tensor> ref;  // eager
};

Step make_step(DType dt, int layers = 2, bool lora = false, bool packed = false) {
  Step s;
  s.cfg = tiny_config(false, false);
  s.cfg.vocab_size = 37;
  s.cfg.num_hidden_layers = layers;
  TrainingGraphOptions o;
  o.batch_size = kB;
  o.seq_len = kT;
  o.packed = packed;
  o.dtype = dt;
  if (lora) {
    peft::LoraConfig c;
    c.attn_modules = {"q_proj", "v_proj"};
    c.apply_to_mlp = true;  // adapters on gate, up and down
    c.rank = 3;
    c.alpha = 6;
    c.dropout = 0.1;
    o.trainable = peft::is_adapter_param;
    o.llama = peft::lora_llama_options(c);
    s.tg = build_training_graph(s.cfg, o);
    s.params = init_parameters(graph_parameters(s.tg.graph), 11, dt, 0.2);
    peft::init_adapters(s.params, s.cfg, c, 3, dt, nullptr);
    for (auto& [name, t] : s.params)  // B away from zero, as after some training
      if (peft::is_adapter_param(name))
        for (int64_t i = 0; i < t.numel(); ++i) {
          const double v = 0.3 * std::sin(double(i) + double(name.size()));
          if (dt == DType::F64)
            t.data<double>()[i] += v;
          else
            t.data<float>()[i] += float(v);
        }
  } else {
    s.tg = build_training_graph(s.cfg, o);
    s.params = init_parameters(graph_parameters(s.tg.graph), 11, dt, 0.2);
  }
  Batch batch = random_batch(kB, kT, s.cfg.vocab_size, 5, packed);
  s.inputs = batch_inputs(batch, dt, 1.0 / double(batch.num_valid_labels()));
  if (lora) s.inputs[peft::kDropoutSeedInput] = ids_tensor({77}, {});
  s.ref = EagerExecutor(s.tg.graph).run(s.inputs, s.params);
  return s;
}

void expect_fused_matches(const Step& s, const std::vector<Tensor>& out, double loss_tol,
                          double grad_tol, const std::string& what) {
  ASSERT_EQ(out.size(), s.ref.size()) << what;
  EXPECT_LE(max_rel_diff(out[0], s.ref[0]), loss_tol) << what << " loss";
  for (size_t k = 1; k < out.size(); ++k)
    EXPECT_LE(max_rel_diff(out[k], s.ref[k]), grad_tol)
        << what << " " << s.tg.graph.outputs()[k].first;
}

// Runs `g` both ways a graph can run: eager, and planned in one arena.
void expect_graph_matches(const Step& s, const Graph& g, CompileMode mode, double loss_tol,
                          double grad_tol, const std::string& what) {
  verify_graph(g);
  expect_fused_matches(s, EagerExecutor(g).run(s.inputs, s.params), loss_tol, grad_tol,
                       what + " (eager)");
  PlanExecutor plan(g, plan_memory(g, mode == CompileMode::Model ? 1 : -1));
  expect_fused_matches(s, plan.run(s.inputs, s.params), loss_tol, grad_tol, what + " (plan)");
}

// Forward values with the MLP's [tokens, ffn] size that a backward node reads: what the step
// keeps alive from the forward to the backward for the gate.
int saved_ffn_values(const Graph& g, int64_t tokens, int64_t ffn) {
  std::vector<bool> read_by_backward(g.nodes().size(), false);
  for (const Node& n : g.nodes())
    if (n.backward)
      for (const Value& v : n.inputs) read_by_backward[v.node] = true;
  int saved = 0;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (n.backward || !read_by_backward[i] || n.outputs.size() != 1 || n.op == Op::Param) continue;
    const TensorType& t = n.outputs[0];
    saved += t.numel() == tokens * ffn && t.shape.back() == ffn;
  }
  return saved;
}

const double kTol32[2] = {1e-5, 1e-4}, kTol64[2] = {1e-12, 1e-10};

}  // namespace

TEST(CompileFuseSwiglu, AloneMatchesEagerAndLeavesNoSilu) {
  for (DType dt : {DType::F32, DType::F64}) {
    const double* tol = dt == DType::F32 ? kTol32 : kTol64;
    for (bool packed : {false, true}) {
      Step s = make_step(dt, 2, false, packed);
      ASSERT_EQ(count_ops(s.tg.graph, Op::Silu), 2);
      for (CompileMode mode : {CompileMode::Model, CompileMode::Full}) {
        PassOptions po;
        po.mode = mode;
        Graph g = s.tg.graph;
        const std::string rep = passes::fuse_swiglu::run(g, po);
        EXPECT_EQ(rep, "fuse_swiglu: fused 2 forward, 2 backward, 2 recomputed for the backward");
        EXPECT_EQ(count_ops(g, Op::Silu), 0);
        EXPECT_EQ(count_ops(g, Op::SiluBackward), 0);
        EXPECT_EQ(count_ops(g, Op::SwiGLU), 4);  // forward + recompute per layer
        EXPECT_EQ(count_ops(g, Op::SwiGLUBackward), 2);
        expect_graph_matches(s, g, mode, tol[0], tol[1],
                             std::string("swiglu ") + dtype_name(dt) + " " +
                                 compile_mode_name(mode) + (packed ? " packed" : ""));
      }
    }
  }
}

TEST(CompileFuseSwiglu, SiluAndItsProductAreNoLongerSavedForTheBackward) {
  Step s = make_step(DType::F32, 3);
  const int64_t tokens = kB * kT, ffn = s.cfg.intermediate_size;
  // Unfused: g, u, silu(g) and silu(g) * u per layer.
  EXPECT_EQ(saved_ffn_values(s.tg.graph, tokens, ffn), 4 * 3);
  PassOptions po;
  Graph fused = run_passes(s.tg.graph, po, nullptr);
  EXPECT_EQ(saved_ffn_values(fused, tokens, ffn), 2 * 3);  // g and u only
  Graph g = s.tg.graph;
  passes::fuse_rmsnorm_residual::run(g, po);  // everything but the SwiGLU fusion
  EXPECT_EQ(saved_ffn_values(g, tokens, ffn), 4 * 3);
  const MemoryPlan pf = plan_memory(fused), pu = plan_memory(g);
  EXPECT_LT(estimate_step_memory(fused, &pf, 2).activations,
            estimate_step_memory(g, &pu, 2).activations);
}

TEST(CompileFuseRmsnormResidual, AloneMatchesEagerAndCountsFusedNodes) {
  for (DType dt : {DType::F32, DType::F64}) {
    const double* tol = dt == DType::F32 ? kTol32 : kTol64;
    Step s = make_step(dt, 2);
    for (CompileMode mode : {CompileMode::Model, CompileMode::Full}) {
      PassOptions po;
      po.mode = mode;
      Graph g = s.tg.graph;
      const std::string rep = passes::fuse_rmsnorm_residual::run(g, po);
      // 2 layers: 5 norms; all but the first layer's input norm follow a residual add, and all
      // but the final norm's backward feed a residual-gradient add.
      EXPECT_EQ(rep, "fuse_rmsnorm_residual: fused 4 add+rmsnorm, 4 rmsnorm_backward+add");
      EXPECT_EQ(count_ops(g, Op::AddRMSNorm), 4);
      EXPECT_EQ(count_ops(g, Op::RMSNorm), 1);
      EXPECT_EQ(count_ops(g, Op::RMSNormBackwardAdd), 4);
      EXPECT_EQ(count_ops(g, Op::RMSNormBackward), 1);
      EXPECT_EQ(count_ops(g, Op::Add) + 8, count_ops(s.tg.graph, Op::Add));
      expect_graph_matches(
          s, g, mode, tol[0], tol[1],
          std::string("rmsnorm ") + dtype_name(dt) + " " + compile_mode_name(mode));
    }
  }
}

TEST(CompileFuseNormSwiglu, PipelineMatchesEagerInEveryModeAndReportsTheFusions) {
  for (DType dt : {DType::F32, DType::F64}) {
    const double* tol = dt == DType::F32 ? kTol32 : kTol64;
    Step s = make_step(dt, 2);
    for (CompileMode mode : {CompileMode::Model, CompileMode::Full}) {
      PassOptions po;
      po.mode = mode;
      std::vector<std::string> report;
      Graph g = run_passes(s.tg.graph, po, &report);
      EXPECT_EQ(count_ops(g, Op::SwiGLUBackward), 2);
      EXPECT_EQ(count_ops(g, Op::AddRMSNorm), 4);
      EXPECT_EQ(count_ops(g, Op::RMSNormBackwardAdd), 4);
      EXPECT_EQ(count_ops(g, Op::Silu) + count_ops(g, Op::SiluBackward), 0);
      bool swiglu_line = false, norm_line = false;
      for (const auto& l : report) {
        swiglu_line |= l.rfind("fuse_swiglu: fused 2 forward", 0) == 0;
        norm_line |= l.rfind("fuse_rmsnorm_residual: fused 4", 0) == 0;
      }
      EXPECT_TRUE(swiglu_line && norm_line);
      CompiledStep step = compile_graph(s.tg.graph, po);
      expect_fused_matches(
          s, step.executor->run(s.inputs, s.params), tol[0], tol[1],
          std::string("pipeline ") + dtype_name(dt) + " " + compile_mode_name(mode));
    }
  }
}

TEST(CompileFuseNormSwiglu, ActivationCheckpointingStillMatchesEager) {
  Step s = make_step(DType::F64, 3);
  for (CompileMode mode : {CompileMode::Model, CompileMode::Full}) {
    PassOptions po;
    po.mode = mode;
    po.activation_checkpointing = true;
    std::vector<std::string> report;
    Graph g = run_passes(s.tg.graph, po, &report);
    EXPECT_NE(report.back().find("3 layers"), std::string::npos) << report.back();
    EXPECT_EQ(count_ops(g, Op::SwiGLUBackward), 3);
    // Only the add+norm pairs inside one layer fuse: each layer keeps one saved input.
    EXPECT_EQ(count_ops(g, Op::AddRMSNorm), 3 * 2);  // the forward and its recomputed copy
    expect_fused_matches(s, compile_graph(s.tg.graph, po).executor->run(s.inputs, s.params), 1e-12,
                         1e-10, std::string("checkpointed ") + compile_mode_name(mode));
  }
  // Checkpointing still saves memory with the fusions on.
  PassOptions plain, ckpt;
  ckpt.activation_checkpointing = true;
  Graph a = run_passes(s.tg.graph, plain, nullptr), b = run_passes(s.tg.graph, ckpt, nullptr);
  EXPECT_LT(estimate_step_memory(b, nullptr, 2).activations,
            estimate_step_memory(a, nullptr, 2).activations);
}

TEST(CompileFuseNormSwiglu, LoraOnTheMlpStillFusesAndMatchesEager) {
  for (DType dt : {DType::F32, DType::F64}) {
    const double* tol = dt == DType::F32 ? kTol32 : kTol64;
    Step s = make_step(dt, 2, /*lora=*/true);
    for (CompileMode mode : {CompileMode::Model, CompileMode::Full}) {
      PassOptions po;
      po.mode = mode;
      Graph g = run_passes(s.tg.graph, po, nullptr);
      EXPECT_EQ(count_ops(g, Op::SwiGLUBackward), 2);
      EXPECT_EQ(count_ops(g, Op::Silu), 0);
      // The first input norm reads the frozen embedding: no gradient flows into it, so 4
      // norm backwards of which the final norm's has no residual add.
      EXPECT_EQ(count_ops(g, Op::RMSNormBackward) + count_ops(g, Op::RMSNormBackwardAdd), 4);
      EXPECT_EQ(count_ops(g, Op::RMSNormBackwardAdd), 3);
      expect_fused_matches(s, compile_graph(s.tg.graph, po).executor->run(s.inputs, s.params),
                           tol[0], tol[1],
                           std::string("lora ") + dtype_name(dt) + " " + compile_mode_name(mode));
    }
  }
}

TEST(CompileFuseNormSwiglu, GraphsThatDoNotMatchAreLeftAlone) {
  // silu(g) * u where silu(g) is also read elsewhere, and an rmsnorm of a broadcast add.
  Graph g(DType::F64);
  Value x = g.input("x", {4, 6}, DType::F64);
  Value w = g.param("w", {6}, true);
  Value s = g.add1(Op::Silu, {x});
  Value p = g.add1(Op::Mul, {s, x});
  Value q = g.add1(Op::Add, {p, s});  // a second reader of silu(x)
  Attrs at;
  at.eps = 1e-5;
  Value n = g.add1(Op::RMSNorm, {g.add1(Op::Add, {q, w}), w}, at);  // broadcast add
  Value loss = g.add1(Op::SumAll, {n});
  g.mark_output("loss", loss);
  append_backward(g, loss);
  Graph before = g;
  compact(before);  // what the passes do first: drop dead nodes
  PassOptions po;
  EXPECT_EQ(passes::fuse_swiglu::run(g, po), "fuse_swiglu: no match");
  EXPECT_EQ(passes::fuse_rmsnorm_residual::run(g, po), "fuse_rmsnorm_residual: no match");
  ASSERT_EQ(g.nodes().size(), before.nodes().size());
  for (size_t i = 0; i < g.nodes().size(); ++i) EXPECT_EQ(g.nodes()[i].op, before.nodes()[i].op);
}

TEST(CompileFuseNormSwiglu, AForwardOnlyGraphFusesTheForward) {
  // No backward (nothing trainable): SwiGLU and AddRMSNorm still apply, with nothing to recompute.
  Graph g(DType::F64);
  Value gt = g.input("g", {3, 5}, DType::F64);
  Value u = g.input("u", {3, 5}, DType::F64);
  Value w = g.param("w", {5}, false);
  Attrs at;
  at.eps = 1e-6;
  Value y = g.add1(Op::RMSNorm,
                   {g.add1(Op::Add, {g.add1(Op::Mul, {g.add1(Op::Silu, {gt}), u}), u}), w}, at);
  g.mark_output("y", y);
  const Graph ref_graph = g;
  PassOptions po;
  EXPECT_EQ(passes::fuse_swiglu::run(g, po),
            "fuse_swiglu: fused 1 forward, 0 backward, 0 recomputed for the backward");
  EXPECT_EQ(passes::fuse_rmsnorm_residual::run(g, po),
            "fuse_rmsnorm_residual: fused 1 add+rmsnorm, 0 rmsnorm_backward+add");
  EXPECT_EQ(count_ops(g, Op::Silu) + count_ops(g, Op::Mul) + count_ops(g, Op::Add) +
                count_ops(g, Op::RMSNorm),
            0);
  TensorMap in{{"g", random_tensor({3, 5}, DType::F64, 1, -4, 4)},
               {"u", random_tensor({3, 5}, DType::F64, 2)}};
  TensorMap params{{"w", random_tensor({5}, DType::F64, 3, 0.5, 1.5)}};
  const Tensor a = EagerExecutor(ref_graph).run(in, params)[0];
  const Tensor b = EagerExecutor(g).run(in, params)[0];
  EXPECT_LE(max_rel_diff(a, b), 1e-14);
}
