// The memory planner's in-place reuse: an output takes over an input's buffer only when the
// kernel allows it and nothing reads that buffer afterwards; the arena shrinks on training
// graphs; compiled steps still compute what eager computes.
#include <gtest/gtest.h>

#include <cmath>

#include "fusetune/compile/compiler.h"
#include "fusetune/compile/memory_plan.h"
#include "fusetune/graph/builder.h"
#include "fusetune/models/parameters.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/peft/lora.h"
#include "fusetune/runtime/node_kernels.h"
#include "fusetune/runtime/plan_executor.h"
#include "graph_compare.h"
#include "tiny_models.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace {

// Runs `g` eagerly and through a plan (in place on), returns the largest relative difference.
double plan_vs_eager(const Graph& g, const TensorMap& inputs, const TensorMap& params,
                     MemoryPlan* plan_out = nullptr) {
  MemoryPlan plan = plan_memory(g);
  if (plan_out) *plan_out = plan;
  auto ref = EagerExecutor(g).run(inputs, params);
  auto out = PlanExecutor(g, plan).run(inputs, params);
  double worst = 0;
  for (size_t k = 0; k < ref.size(); ++k) worst = std::max(worst, max_rel_diff(out[k], ref[k]));
  return worst;
}

int index_of(const Value& v) { return v.node; }

}  // namespace

TEST(MemoryPlanInPlace, WritesOverAnInputOnlyAtItsLastRead) {
  Graph g(DType::F64);
  Builder b(g);
  Value x = g.input("x", {4, 8}, DType::F64);
  Value a = b.scale(x, 2.0);  // arena buffer
  Value s = b.silu(a);        // a is read again below: must not write over a
  Value c = b.add(a, s);      // last read of a and s: writes over one of them
  Value d = b.scale(c, 0.5);  // writes over c
  Value e = b.mul(d, d);      // writes over d
  g.mark_output("y", b.sum(e));
  TensorMap in{{"x", random_tensor({4, 8}, DType::F64, 1)}};
  MemoryPlan plan;
  EXPECT_EQ(plan_vs_eager(g, in, {}, &plan), 0.0);
  EXPECT_EQ(plan.writes_over[index_of(s)], -1);
  EXPECT_EQ(plan.writes_over[index_of(a)], -1);  // x is an input, never written over
  EXPECT_TRUE(plan.writes_over[index_of(c)] == a.node || plan.writes_over[index_of(c)] == s.node);
  EXPECT_EQ(plan.writes_over[index_of(d)], c.node);
  EXPECT_EQ(plan.writes_over[index_of(e)], d.node);
  EXPECT_EQ(plan.offsets[e.node][0], plan.offsets[c.node][0]);
  EXPECT_NE(plan.offsets[s.node][0], plan.offsets[a.node][0]);
  // Without in place, every buffer gets its own slot.
  MemoryPlan separate = plan_memory(g, -1, false);
  EXPECT_EQ(separate.in_place, 0);
  EXPECT_LT(plan.arena_bytes, separate.arena_bytes);
}

TEST(MemoryPlanInPlace, ViewsKeepTheirSourceAlive) {
  Graph g(DType::F64);
  Builder b(g);
  Value x = g.input("x", {4, 6}, DType::F64);
  Value a = b.scale(x, 3.0);
  Value v1 = b.reshape(a, {24});
  Value v2 = b.reshape(a, {2, 12});
  Value s = b.silu(v1);  // a is still read through v2 below
  Value t = b.add(b.reshape(s, {2, 12}), v2);
  g.mark_output("y", b.sum(t));
  TensorMap in{{"x", random_tensor({4, 6}, DType::F64, 2)}};
  MemoryPlan plan;
  EXPECT_EQ(plan_vs_eager(g, in, {}, &plan), 0.0);
  EXPECT_EQ(plan.writes_over[s.node], -1);
  EXPECT_NE(plan.offsets[s.node][0], plan.offsets[a.node][0]);
}

TEST(MemoryPlanInPlace, NeverOverLeavesOutputsOrBroadcastOperands) {
  Graph g(DType::F64);
  Builder b(g);
  Value w = g.param("w", {8}, true);
  Value x = g.input("x", {4, 8}, DType::F64);
  Value sw = b.scale(w, 2.0);  // [8] arena buffer, last read by the broadcast add below
  Value y = b.add(x, sw);      // x is an input: no in place; sw is a broadcast operand
  Value o = b.silu(y);         // a graph output: not in the arena
  Value z = b.scale(o, 2.0);   // reads a graph output: o must survive
  g.mark_output("o", o);
  g.mark_output("z", b.sum(z));
  TensorMap in{{"x", random_tensor({4, 8}, DType::F64, 3)}};
  TensorMap params{{"w", random_tensor({8}, DType::F64, 4)}};
  MemoryPlan plan;
  EXPECT_EQ(plan_vs_eager(g, in, params, &plan), 0.0);
  EXPECT_EQ(plan.writes_over[sw.node], -1);
  EXPECT_EQ(plan.writes_over[y.node], -1);
  EXPECT_EQ(plan.offsets[o.node][0], -1);
  EXPECT_EQ(plan.writes_over[z.node], -1);
}

TEST(MemoryPlanInPlace, TheListOfInPlaceKernels) {
  Graph g(DType::F64);
  Builder b(g);
  Value x = g.input("x", {2, 4}, DType::F64);
  Value w = g.param("w", {4}, true);
  auto node = [&](Value v) { return g.node(v); };
  EXPECT_TRUE(can_write_over_input(node(b.add(x, w)), 0));
  EXPECT_TRUE(can_write_over_input(node(b.scale(x, 2)), 0));
  EXPECT_FALSE(can_write_over_input(node(b.matmul(x, x, false, true)), 0));
  EXPECT_FALSE(can_write_over_input(node(b.transpose(x, 0, 1)), 0));
  EXPECT_TRUE(can_write_over_input(node(b.rmsnorm(x, w, 1e-5)), 0));
  EXPECT_FALSE(can_write_over_input(node(b.rmsnorm(x, w, 1e-5)), 1));
  Attrs at;
  at.eps = 1e-5;
  auto rb = g.add(Op::RMSNormBackward, {x, w, x}, at);  // reads dy again for dw: never
  for (int j = 0; j < 3; ++j) EXPECT_FALSE(can_write_over_input(g.node(rb[0]), j)) << j;
  at.shape = {4};
  EXPECT_FALSE(can_write_over_input(node(g.add1(Op::SumToShape, {x}, at)), 0));
}

// Every kernel in the list, run with its output over its input, against eager.
TEST(MemoryPlanInPlace, EveryInPlaceKernelMatchesEager) {
  for (DType dt : {DType::F64, DType::F32}) {
    Graph g(dt);
    Builder b(g);
    const int64_t B = 1, H = 2, T = 4, D = 4;
    Value x = g.input("x", {B, H, T, T}, dt);
    Value xr = g.input("xr", {B, T, H, D}, dt);
    Value pos = g.input("pos", {B, T}, DType::I32);
    Value w = g.param("w", {T}, true);
    Value cs = g.param("cos", {16, D / 2}, false), sn = g.param("sin", {16, D / 2}, false);
    Value seed = g.input("seed", {}, DType::I32);
    std::vector<Value> results;
    std::vector<int> ops;
    auto copy = [&](Value v) { return b.scale(v, 1.0); };  // a fresh arena buffer
    auto keep = [&](Value y) {
      ops.push_back(y.node);
      results.push_back(b.scale(y, 1.0));  // y's last reader; its own output is then read out
    };
    keep(b.softmax(copy(x)));
    keep(b.log_softmax(copy(x)));
    keep(b.causal_mask(copy(x)));
    keep(g.add1(Op::CausalMaskBackward, {copy(x)}));
    keep(b.rmsnorm(copy(x), w, 1e-5));
    keep(b.rope(copy(xr), cs, sn, pos));
    keep(b.silu(copy(x)));
    keep(g.add1(Op::SiluBackward, {copy(x), copy(b.scale(x, -0.5))}));
    keep(g.add1(Op::SoftmaxBackward, {b.softmax(x), copy(x)}));
    keep(g.add1(Op::LogSoftmaxBackward, {b.log_softmax(x), copy(x)}));
    Attrs dr;
    dr.scalar = 0.3;
    dr.start = 5;
    keep(g.add1(Op::Dropout, {copy(x), seed}, dr));
    keep(b.mul(copy(x), w));
    keep(b.add(copy(x), copy(x)));
    for (size_t i = 0; i < results.size(); ++i) g.mark_output("r" + std::to_string(i), results[i]);
    TensorMap in{{"x", random_tensor({B, H, T, T}, dt, 5)},
                 {"xr", random_tensor({B, T, H, D}, dt, 6)},
                 {"pos", ids_tensor({0, 1, 2, 3}, {B, T})},
                 {"seed", ids_tensor({9}, {})}};
    TensorMap params{{"w", random_tensor({T}, dt, 7)},
                     {"cos", random_tensor({16, D / 2}, dt, 8)},
                     {"sin", random_tensor({16, D / 2}, dt, 9)}};
    MemoryPlan plan;
    EXPECT_EQ(plan_vs_eager(g, in, params, &plan), 0.0) << dtype_name(dt);
    for (int id : ops)
      EXPECT_GE(plan.writes_over[size_t(id)], 0) << op_name(g.nodes()[size_t(id)].op);
  }
}

TEST(MemoryPlanInPlace, ArenaShrinksOnTrainingGraphsAndStepsMatchEager) {
  struct Case {
    const char* name;
    bool lora;
  };
  for (const Case c : {Case{"full", false}, Case{"lora", true}}) {
    ModelConfig cfg = tiny_config(false, true);
    cfg.vocab_size = 37;
    TrainingGraphOptions o;
    o.batch_size = 2;
    o.seq_len = 8;
    peft::LoraConfig lc;
    lc.attn_modules = {"q_proj", "v_proj", "output_proj"};
    lc.apply_to_mlp = true;
    lc.rank = 2;
    lc.alpha = 4;
    if (c.lora) {
      o.trainable = peft::is_adapter_param;
      o.llama = peft::lora_llama_options(lc);
    }
    TrainingGraph tg = build_training_graph(cfg, o);
    TensorMap params = init_parameters(graph_parameters(tg.graph), 11, DType::F32, 0.2);
    if (c.lora) {
      peft::init_adapters(params, cfg, lc, 3, DType::F32);
      for (auto& [name, t] : params)
        if (name.find("lora_B") != std::string::npos)
          for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = 0.01f * float(i % 7);
    }
    Batch batch = random_batch(2, 8, cfg.vocab_size, 5);
    TensorMap inputs = batch_inputs(batch, DType::F32, 1.0 / double(batch.num_valid_labels()));
    auto ref = EagerExecutor(tg.graph).run(inputs, params);
    for (CompileMode mode : {CompileMode::Model, CompileMode::Full}) {
      // The planner on its own, on the unfused joint graph (the fusion passes leave fewer
      // in-place pairs: their kernels already write each byte once).
      const Graph& run = tg.graph;
      const int region = mode == CompileMode::Model ? 1 : -1;
      MemoryPlan with = plan_memory(run, region, true), without = plan_memory(run, region, false);
      EXPECT_GT(with.in_place, 10) << c.name;
      EXPECT_LT(with.arena_bytes, without.arena_bytes) << c.name;
      EXPECT_EQ(with.placed_bytes, without.placed_bytes) << c.name;
      // After all passes, in place is used only where it does not grow the arena.
      PassOptions po;
      po.mode = mode;
      Graph fused = run_passes(tg.graph, po, nullptr);
      EXPECT_LE(plan_memory(fused, region).arena_bytes,
                plan_memory(fused, region, false).arena_bytes)
          << c.name;
      auto out = PlanExecutor(run, with).run(inputs, params);
      ASSERT_EQ(out.size(), ref.size());
      EXPECT_LE(max_rel_diff(out[0], ref[0]), 1e-5) << c.name << " loss";
      for (size_t k = 1; k < out.size(); ++k)
        EXPECT_LE(max_rel_diff(out[k], ref[k]), 1e-4)
            << c.name << " " << compile_mode_name(mode) << " " << tg.graph.outputs()[k].first;
    }
  }
}
