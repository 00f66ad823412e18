// Generic elementwise fusion: the block interpreter against the unfused kernels (bitwise, with
// broadcasts and ragged block ends), the pass on hand-built trees (what fuses, what must not),
// and on training graphs (full and LoRA) against eager.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "fusetune/compile/compiler.h"
#include "fusetune/compile/dead_code.h"
#include "fusetune/compile/fuse_elementwise.h"
#include "fusetune/compile/memory_plan.h"
#include "fusetune/graph/builder.h"
#include "fusetune/graph/verifier.h"
#include "fusetune/kernels/cpu/elementwise_program.h"
#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/models/parameters.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/peft/lora.h"
#include "fusetune/runtime/plan_executor.h"
#include "fusetune/util/error.h"
#include "graph_compare.h"
#include "tiny_models.h"

using namespace fusetune;
using namespace fusetune::testing;
using kernels::EwInstr;
using kernels::EwOp;

namespace {

// LoRA B starts at zero; give it values so the adapter path carries gradient.
void set_lora_b(TensorMap& params) {
  for (auto& [name, t] : params)
    if (name.find("lora_B") != std::string::npos)
      for (int64_t i = 0; i < t.numel(); ++i) {
        if (t.dtype() == DType::F64)
          t.data<double>()[i] = 0.01 * double(i % 5);
        else
          t.data<float>()[i] = 0.01f * float(i % 5);
      }
}

EwInstr ins(EwOp op, int a = 0, int b = 0, double c = 0) {
  EwInstr I;
  I.op = op;
  I.a = a;
  I.b = b;
  I.c = c;
  return I;
}

// out = silu'(x) * ((y + s * z) * bias) - unfused, one kernel call per op, vs the program.
template <class T>
void check_program(int64_t n, int64_t nb) {
  std::mt19937_64 rng(uint64_t(n * 31 + nb));
  std::uniform_real_distribution<double> u(-3.0, 3.0);
  const size_t sn = static_cast<size_t>(n);
  std::vector<T> x(sn), y(sn), z(sn), bias(static_cast<size_t>(nb));
  for (auto* v : {&x, &y, &z, &bias})
    for (auto& e : *v) e = T(u(rng));
  const T s = T(0.375);
  std::vector<T> t1(sn), t2(sn), t3(sn), ref(sn);
  kernels::scale<T>(z.data(), s, t1.data(), n);
  kernels::add<T>(y.data(), t1.data(), t2.data(), n, n);
  kernels::mul<T>(t2.data(), bias.data(), t3.data(), n, nb);
  kernels::silu_backward<T>(x.data(), t3.data(), ref.data(), n);
  std::vector<EwInstr> code = {ins(EwOp::Load, 0),   ins(EwOp::Load, 1),
                               ins(EwOp::Load, 2),   ins(EwOp::Scale, 2, 0, s),
                               ins(EwOp::Add, 1, 3), ins(EwOp::Load, 3),
                               ins(EwOp::Mul, 4, 5), ins(EwOp::SiluBackward, 0, 6)};
  for (size_t i = 0; i < code.size(); ++i) code[i].dst = int32_t(i);
  std::vector<T> out(sn, T(-7));
  kernels::elementwise_program<T>(code, {x.data(), y.data(), z.data(), bias.data()}, {n, n, n, nb},
                                  out.data(), n);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(out[size_t(i)], ref[size_t(i)]) << "n " << n << " i " << i;
  // In place over a same-size input (the memory planner may do this).
  std::vector<T> yy = y;
  kernels::elementwise_program<T>(code, {x.data(), yy.data(), z.data(), bias.data()}, {n, n, n, nb},
                                  yy.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(yy[size_t(i)], ref[size_t(i)]) << "in place, i " << i;
}

}  // namespace

TEST(ElementwiseProgram, MatchesTheUnfusedKernelsBitwise) {
  for (auto [n, nb] : {std::pair<int64_t, int64_t>{1, 1},
                       {7, 7},
                       {256, 1},
                       {300, 3},
                       {1000, 40},
                       {4096, 512},
                       {70000, 700},
                       {65536 + 17, 1}}) {
    check_program<float>(n, nb);
    check_program<double>(n, nb);
  }
}

TEST(ElementwiseProgram, RejectsMalformedPrograms) {
  std::vector<float> a(8, 1.f), out(8);
  auto run = [&](std::vector<EwInstr> code, std::vector<int64_t> sizes = {8}) {
    for (size_t i = 0; i < code.size(); ++i) code[i].dst = int32_t(i);
    kernels::elementwise_program<float>(code, {a.data()}, sizes, out.data(), 8);
  };
  EXPECT_THROW(run({}), Error);
  EXPECT_THROW(run({ins(EwOp::Load, 1)}), Error);                        // no input 1
  EXPECT_THROW(run({ins(EwOp::Load, 0), ins(EwOp::Add, 0, 5)}), Error);  // unset register
  EXPECT_THROW(run({ins(EwOp::Load, 0)}, {3}), Error);                   // 3 does not divide 8
  EXPECT_THROW(kernels::decode_program({1, 2, 3}), Error);
  EXPECT_THROW(kernels::decode_program({99, 0, 0, 0, 0}), Error);
  EXPECT_NO_THROW(run({ins(EwOp::Load, 0), ins(EwOp::Silu, 0)}));
  const auto code = kernels::decode_program(kernels::encode_program({ins(EwOp::Scale, 3, 0, 0.1)}));
  ASSERT_EQ(code.size(), 1u);
  EXPECT_EQ(code[0].op, EwOp::Scale);
  EXPECT_EQ(code[0].a, 3);
  EXPECT_EQ(code[0].c, 0.1);
}

// Hand-built trees: what fuses, what stays, and the values against eager.
TEST(FuseElementwise, FusesTreesWhoseIntermediatesHaveNoOtherReader) {
  for (DType dt : {DType::F64, DType::F32}) {
    Graph g(dt);
    Builder b(g);
    Value base = g.input("base", {6, 10}, dt);
    Value lora = g.input("lora", {6, 10}, dt);
    Value c = g.input("c", {6, 10}, dt);
    Value bias = g.param("bias", {10}, true);
    Value up = g.input("up", {3, 20}, dt);
    // LoRA sum then a bias add through a reshape: Add(Reshape(Add(base, Scale(lora))), bias).
    Value sum = b.add(base, b.scale(lora, 0.5));
    Value y1 = b.add(b.reshape(sum, {2, 3, 10}), b.add(bias, bias));
    // Gradient accumulation (a + b) + c, where a + b is also read elsewhere: only the outer
    // add and nothing else may take it.
    Value ab = b.add(base, lora);
    Value acc = b.add(ab, c);
    Value other = b.silu(ab);
    // silu'(x) * (dy * up) as the SwiGLU backward emits it.
    Value dy = b.reshape(c, {3, 20});
    Value sb = g.add1(Op::SiluBackward, {b.reshape(base, {3, 20}), b.mul(dy, up)});
    g.mark_output("y1", y1);
    g.mark_output("acc", acc);
    g.mark_output("other", other);
    g.mark_output("sb", sb);
    TensorMap in{{"base", random_tensor({6, 10}, dt, 1, -2.0, 2.0)},
                 {"lora", random_tensor({6, 10}, dt, 2, -2.0, 2.0)},
                 {"c", random_tensor({6, 10}, dt, 3, -2.0, 2.0)},
                 {"up", random_tensor({3, 20}, dt, 4, -2.0, 2.0)}};
    TensorMap params{{"bias", random_tensor({10}, dt, 5, -2.0, 2.0)}};
    auto ref = EagerExecutor(g).run(in, params);

    Graph f = g;
    std::string line = passes::fuse_elementwise::run(f, PassOptions{});
    verify_graph(f);
    // y1: add(reshape(add(base, scale)), bias + bias) -> 1 node of 3 ops (bias + bias has a
    // different element count: an input, a single op left alone); acc and other stay (ab has
    // two readers); sb: 2 ops -> 1.
    EXPECT_EQ(count_ops(f, Op::Elementwise), 2) << line;
    EXPECT_EQ(count_ops(f, Op::Scale), 0);
    EXPECT_EQ(count_ops(f, Op::SiluBackward), 0);
    EXPECT_EQ(count_ops(f, Op::Silu), 1);         // other: a single op, nothing to fuse
    EXPECT_EQ(count_ops(f, Op::Add), 3) << line;  // ab, acc (ab is shared), bias + bias (1 op)
    auto out = EagerExecutor(f).run(in, params);
    auto planned = PlanExecutor(f, plan_memory(f)).run(in, params);
    for (size_t k = 0; k < ref.size(); ++k) {
      EXPECT_EQ(max_rel_diff(out[k], ref[k]), 0.0) << dtype_name(dt) << " output " << k;
      EXPECT_EQ(max_rel_diff(planned[k], ref[k]), 0.0) << dtype_name(dt) << " output " << k;
    }
  }
}

TEST(FuseElementwise, BroadcastOperandsAndFillsAndModelOnlyRegion) {
  Graph g(DType::F64);
  Builder b(g);
  Value x = g.input("x", {4, 6}, DType::F64);
  Value s = g.input("s", {}, DType::F64);
  Value row = g.input("row", {6}, DType::F64);
  Value zeros = g.fill({4, 6}, 0.0);
  // Add(zeros, row) is how SumToShape's VJP broadcasts; then * s and + x.
  Value y = b.add(b.mul(b.add(zeros, row), s), x);
  g.set_region(1);
  Value z = b.scale(b.silu(x), 3.0);  // loss region: left alone under compile: model
  g.set_region(0);
  g.mark_output("y", y);
  g.mark_output("z", z);
  TensorMap in{{"x", random_tensor({4, 6}, DType::F64, 1, -2.0, 2.0)},
               {"s", random_tensor({}, DType::F64, 2, -2.0, 2.0)},
               {"row", random_tensor({6}, DType::F64, 3, -2.0, 2.0)}};
  auto ref = EagerExecutor(g).run(in, {});
  PassOptions model;
  model.mode = CompileMode::Model;
  Graph f = g;
  passes::fuse_elementwise::run(f, model);
  verify_graph(f);
  EXPECT_EQ(count_ops(f, Op::Elementwise), 1);
  EXPECT_EQ(count_ops(f, Op::Fill), 0);  // became a constant of the program
  EXPECT_EQ(count_ops(f, Op::Silu), 1);
  auto out = EagerExecutor(f).run(in, {});
  for (size_t k = 0; k < ref.size(); ++k) EXPECT_EQ(max_rel_diff(out[k], ref[k]), 0.0) << k;
  Graph full = g;
  passes::fuse_elementwise::run(full, PassOptions{});
  EXPECT_EQ(count_ops(full, Op::Elementwise), 2);
  EXPECT_EQ(count_ops(full, Op::Silu), 0);
}

TEST(FuseElementwise, LongChainsSplitWithinTheRegisterBudget) {
  Graph g(DType::F64);
  Builder b(g);
  Value x = g.input("x", {5, 7}, DType::F64);
  Value v = x;
  for (int i = 0; i < 30; ++i) v = i % 3 == 0 ? b.silu(v) : b.add(b.scale(v, 0.9), x);
  g.mark_output("v", v);
  TensorMap in{{"x", random_tensor({5, 7}, DType::F64, 4, -2.0, 2.0)}};
  auto ref = EagerExecutor(g).run(in, {});
  Graph f = g;
  passes::fuse_elementwise::run(f, PassOptions{});
  verify_graph(f);
  EXPECT_GE(count_ops(f, Op::Elementwise), 7);  // 50 ops, at most 7 per node
  // At most one op is left alone (a remainder of one has nothing to fuse with).
  EXPECT_LE(count_ops(f, Op::Add) + count_ops(f, Op::Scale) + count_ops(f, Op::Silu), 1);
  auto out = EagerExecutor(f).run(in, {});
  EXPECT_EQ(max_rel_diff(out[0], ref[0]), 0.0);
}

// The pass on its own on training graphs (loss and gradients against eager).
TEST(FuseElementwise, TrainingGraphsMatchEager) {
  for (bool lora : {false, true})
    for (DType dt : {DType::F64, DType::F32}) {
      ModelConfig cfg = tiny_config(false, true);
      cfg.vocab_size = 37;
      TrainingGraphOptions o;
      o.batch_size = 2;
      o.seq_len = 8;
      o.dtype = dt;
      peft::LoraConfig lc;
      lc.attn_modules = {"q_proj", "k_proj", "v_proj", "output_proj"};
      lc.apply_to_mlp = true;
      lc.rank = 2;
      lc.alpha = 4;
      if (lora) {
        o.trainable = peft::is_adapter_param;
        o.llama = peft::lora_llama_options(lc);
      }
      TrainingGraph tg = build_training_graph(cfg, o);
      TensorMap params = init_parameters(graph_parameters(tg.graph), 11, dt, 0.2);
      if (lora) {
        peft::init_adapters(params, cfg, lc, 3, dt);
        set_lora_b(params);
      }
      Batch batch = random_batch(2, 8, cfg.vocab_size, 5);
      TensorMap inputs = batch_inputs(batch, dt, 1.0 / double(batch.num_valid_labels()));
      auto ref = EagerExecutor(tg.graph).run(inputs, params);
      Graph f = tg.graph;
      passes::dead_code::run(f, PassOptions{});
      std::string line = passes::fuse_elementwise::run(f, PassOptions{});
      verify_graph(f);
      EXPECT_GE(count_ops(f, Op::Elementwise), lora ? 16 : 4) << line;
      std::printf("%s %s: %s\n", lora ? "lora" : "full", dtype_name(dt), line.c_str());
      const double loss_tol = dt == DType::F64 ? 1e-12 : 1e-5;
      const double grad_tol = dt == DType::F64 ? 1e-10 : 1e-4;
      for (bool planned : {false, true}) {
        auto out = planned ? PlanExecutor(f, plan_memory(f)).run(inputs, params)
                           : EagerExecutor(f).run(inputs, params);
        ASSERT_EQ(out.size(), ref.size());
        EXPECT_LE(max_rel_diff(out[0], ref[0]), loss_tol) << line;
        for (size_t k = 1; k < out.size(); ++k)
          EXPECT_LE(max_rel_diff(out[k], ref[k]), grad_tol)
              << (lora ? "lora " : "full ") << dtype_name(dt) << " " << tg.graph.outputs()[k].first;
      }
    }
}
