// dtype: bf16. Values are stored as bf16 and every kernel computes in fp32, so:
//  - the tiled paths that never widen a weight whole compute what the widened weight computes;
//  - gradients of a bf16 step match the fp32 step on the same (bf16-representable) weights
//    within bf16's precision, in every compile mode, and the modes agree with each other;
//  - the recipes train, save and resume in bf16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "fusetune/compile/compiler.h"
#include "fusetune/compile/memory_plan.h"
#include "fusetune/io/safetensors.h"
#include "fusetune/kernels/cpu/bf16.h"
#include "fusetune/kernels/cpu/elementwise_program.h"
#include "fusetune/kernels/cpu/fused_linear_cross_entropy.h"
#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/models/parameters.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/runtime/bf16_node_kernels.h"
#include "fusetune/runtime/eager_executor.h"
#include "fusetune/runtime/plan_executor.h"
#include "fusetune/util/error.h"
#include "graph_compare.h"
#include "recipe_runs.h"
#include "test_support.h"
#include "tiny_models.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace {

std::vector<float> random_floats(int64_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16(v[i]);
  return out;
}

// C = A op(B) in double, B given as bf16: the definition the tiled kernels must meet.
std::vector<double> reference_product(bool trans_b, int64_t M, int64_t N, int64_t K,
                                      const std::vector<float>& A, const std::vector<uint16_t>& B) {
  std::vector<double> C(static_cast<size_t>(M * N), 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k)
        s += double(A[size_t(i * K + k)]) *
             double(bf16_to_f32(B[size_t(trans_b ? j * K + k : k * N + j)]));
      C[size_t(i * N + j)] = s;
    }
  return C;
}

double max_rel(const float* got, const std::vector<double>& want) {
  double worst = 0, scale = 0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, std::abs(double(got[i]) - want[i]));
  return worst / std::max(scale, 1e-30);
}

// The params of `g` in `dtype`, with values that bf16 represents exactly (initialized, then
// rounded), so that fp32 and bf16 runs start from the same weights.
TensorMap representable_params(const Graph& g, DType dtype, uint64_t seed) {
  TensorMap p = init_parameters(graph_parameters(g), seed, DType::F32, 0.2);
  for (auto& [name, t] : p) t = t.to(DType::BF16).to(dtype);
  return p;
}

// ||a - b|| / ||b||: the error of a whole gradient, not of its smallest entries.
double rel_l2(const Tensor& a, const Tensor& b) {
  double d = 0, n = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = element_as_double(a, i), y = element_as_double(b, i);
    d += (x - y) * (x - y);
    n += y * y;
  }
  return std::sqrt(d / std::max(n, 1e-300));
}

}  // namespace

TEST(Bf16Kernels, ConversionRoundsToNearestEvenAndWidensExactly) {
  const std::vector<float> x = {1.0f,
                                1.00390625f /* halfway: ties to even, down */,
                                1.01171875f /* halfway: up */,
                                -3.5f,
                                1e-40f,
                                std::numeric_limits<float>::infinity(),
                                std::nanf("")};
  std::vector<uint16_t> b(x.size());
  kernels::f32_to_bf16_array(x.data(), b.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(b[i], f32_to_bf16(x[i])) << i;
  EXPECT_EQ(bf16_to_f32(b[1]), 1.0f);
  EXPECT_EQ(bf16_to_f32(b[2]), 1.015625f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(b[6])));
  std::vector<float> back(x.size());
  kernels::bf16_to_f32_array(b.data(), back.data(), int64_t(b.size()));
  for (size_t i = 0; i < x.size() - 1; ++i) EXPECT_EQ(back[i], bf16_to_f32(b[i])) << i;
}

TEST(Bf16Kernels, TiledWeightProductMatchesTheDefinitionAcrossTiles) {
  // 16 columns: a tile holds max(256, 1 MiB / 64 B) = 16384 rows, so 20000 rows are 2 tiles.
  const int64_t rows = 20000, cols = 16, M = 3;
  ASSERT_LT(kernels::bf16_tile_rows(rows, cols), rows);
  const std::vector<uint16_t> W = to_bf16(random_floats(rows * cols, 1));
  for (bool trans_b : {true, false}) {
    const int64_t N = trans_b ? rows : cols, K = trans_b ? cols : rows;
    const std::vector<float> A = random_floats(M * K, 2);
    std::vector<float> C(size_t(M * N));
    kernels::gemm_bf16_weight(trans_b, M, N, K, A.data(), W.data(), C.data());
    EXPECT_LE(max_rel(C.data(), reference_product(trans_b, M, N, K, A, W)), 1e-5)
        << "trans_b " << trans_b;
  }
}

TEST(Bf16Kernels, FusedCrossEntropyWithABf16HeadMatchesTheWidenedHead) {
  const int64_t N = 40, D = 8, V = 70000;  // V > one tile of rows (max(64, 32768))
  const std::vector<float> h = random_floats(N * D, 3);
  const std::vector<uint16_t> W = to_bf16(random_floats(V * D, 4, 0.5f));
  std::vector<float> Wf(W.size());
  kernels::bf16_to_f32_array(W.data(), Wf.data(), V * D);
  std::vector<int32_t> labels(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) labels[size_t(i)] = i % 5 == 0 ? -100 : int32_t(i * 997 % V);
  std::vector<float> dh(size_t(N * D)), dW(size_t(V * D)), dh_ref(dh.size()), dW_ref(dW.size());
  const double loss = kernels::fused_bf16_linear_cross_entropy(
      h.data(), W.data(), labels.data(), 0.1f, N, D, V, 16, dh.data(), dW.data());
  const double ref = kernels::fused_linear_cross_entropy<float>(
      h.data(), Wf.data(), labels.data(), 0.1f, N, D, V, 16, dh_ref.data(), dW_ref.data());
  EXPECT_NEAR(loss, ref, 1e-5 * std::abs(ref));
  std::vector<double> dh_d(dh_ref.begin(), dh_ref.end()), dW_d(dW_ref.begin(), dW_ref.end());
  EXPECT_LE(max_rel(dh.data(), dh_d), 1e-5);
  EXPECT_LE(max_rel(dW.data(), dW_d), 1e-5);
}

TEST(Bf16Kernels, EmbeddingBackwardIsTheFp32SumRoundedOnce) {
  const int64_t n = 300, D = 40, V = 50;  // ids repeat: up to ~6 rows per id
  const std::vector<float> dy = random_floats(n * D, 8);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = int32_t((i * 7919) % V);
  ids[5] = 3;  // and one id that appears in two distant places
  std::vector<float> ref(static_cast<size_t>(V * D));
  kernels::embedding_backward<float>(dy.data(), ids.data(), ref.data(), n, D, V);
  std::vector<uint16_t> got(static_cast<size_t>(V * D), 0xFFFF);
  kernels::embedding_backward_bf16(dy.data(), ids.data(), got.data(), n, D, V);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], f32_to_bf16(ref[i])) << i;
  ids[7] = int32_t(V);
  EXPECT_THROW(kernels::embedding_backward_bf16(dy.data(), ids.data(), got.data(), n, D, V), Error);
}

// The pointwise ops run in per-thread chunks (widen a chunk, fp32 kernel, round the chunk):
// what the fp32 kernel computes on the widened tensors, rounded once, bit for bit, in eager
// mode (the node's own scratch) and in a compiled plan (the arena's scratch slice), for
// same-size operands over several chunks with a ragged end and for a one-element operand.
TEST(Bf16Graph, PointwiseOpsInChunksAreTheFp32KernelRoundedOnce) {
  const Shape s{3, 70001};
  const int64_t n = 3 * 70001;
  using kernels::EwInstr;
  using kernels::EwOp;
  Attrs program;  // (x + y) * silu(x) * 0.5
  program.program = kernels::encode_program({{EwOp::Load, 0, 0},
                                             {EwOp::Load, 1, 1},
                                             {EwOp::Add, 2, 0, 1},
                                             {EwOp::Silu, 3, 0},
                                             {EwOp::Mul, 2, 2, 3},
                                             {EwOp::Scale, 2, 2, 0, 0.5}});
  program.shape = s;  // the output's
  Attrs half;
  half.scalar = 0.5;
  struct Case {
    Op op;
    int inputs;
    Attrs attrs;
    bool scalar_second = false;  // the second operand has one element
  };
  const std::vector<Case> cases = {{Op::Add, 2, {}},
                                   {Op::Add, 2, {}, true},
                                   {Op::Mul, 2, {}},
                                   {Op::Scale, 1, half},
                                   {Op::Silu, 1, {}},
                                   {Op::SiluBackward, 2, {}},
                                   {Op::SwiGLU, 2, {}},
                                   {Op::SwiGLUBackward, 3, {}},
                                   {Op::Elementwise, 2, program},
                                   {Op::Elementwise, 2, program, true}};
  for (const Case& c : cases) {
    // The same node in a bf16 graph and, on the widened values, in an fp32 graph.
    Graph g16(DType::BF16), g32(DType::F32);
    std::vector<Value> in16, in32;
    TensorMap x16, x32;
    for (int i = 0; i < c.inputs; ++i) {
      const std::string name = "x" + std::to_string(i);
      const Shape shape = i == 1 && c.scalar_second ? Shape{} : s;
      const int64_t numel = i == 1 && c.scalar_second ? 1 : n;
      in16.push_back(g16.input(name, shape, DType::BF16));
      in32.push_back(g32.input(name, shape, DType::F32));
      const std::vector<uint16_t> v = to_bf16(random_floats(numel, 20 + uint64_t(i)));
      x16[name] = Tensor::empty(shape, DType::BF16);
      x32[name] = Tensor::empty(shape, DType::F32);
      std::copy(v.begin(), v.end(), x16[name].data<uint16_t>());
      kernels::bf16_to_f32_array(v.data(), x32[name].data<float>(), numel);
    }
    const std::vector<Value> out16 = g16.add(c.op, in16, c.attrs);
    const std::vector<Value> out32 = g32.add(c.op, in32, c.attrs);
    for (size_t k = 0; k < out16.size(); ++k) {
      g16.mark_output("y" + std::to_string(k), out16[k]);
      g32.mark_output("y" + std::to_string(k), out32[k]);
    }
    const Node& node = g16.nodes().back();
    ASSERT_LT(bf16_conversion_scratch_bytes(g16, node), n * 4)  // chunks, not whole tensors
        << op_name(c.op);
    const auto want = EagerExecutor(g32).run(x32, {});
    const MemoryPlan plan = plan_memory(g16);
    EXPECT_EQ(plan.scratch_bytes, bf16_conversion_scratch_bytes(g16, node));
    EXPECT_GE(plan.arena_bytes, plan.scratch_offset + plan.scratch_bytes);
    const auto eager = EagerExecutor(g16).run(x16, {});
    const auto planned = PlanExecutor(g16, plan).run(x16, {});
    for (size_t k = 0; k < want.size(); ++k)
      for (const auto* got : {&eager[k], &planned[k]}) {
        ASSERT_EQ(got->dtype(), DType::BF16);
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(got->data<uint16_t>()[i], f32_to_bf16(want[k].data<float>()[i]))
              << op_name(c.op) << " output " << k << " element " << i
              << (got == &eager[k] ? " eager" : " planned");
      }
  }
}

TEST(Bf16Graph, StoresTensorsInBf16AndScalarsAndStatisticsInFp32) {
  ModelConfig cfg = tiny_config(false, false);
  TrainingGraphOptions o;
  o.batch_size = 2;
  o.seq_len = 8;
  o.dtype = DType::BF16;
  TrainingGraph tg = build_training_graph(cfg, o);
  const Graph& g = tg.graph;
  EXPECT_EQ(g.type(g.outputs()[0].second).dtype, DType::F32);  // the loss
  for (size_t k = 1; k < g.outputs().size(); ++k)
    EXPECT_EQ(g.type(g.outputs()[k].second).dtype, DType::BF16) << g.outputs()[k].first;
  PassOptions po;
  po.mode = CompileMode::Full;
  const Graph compiled = run_passes(g, po, nullptr);
  int attention = 0;
  for (const Node& n : compiled.nodes())
    if (n.op == Op::FlashAttention) {
      ++attention;
      EXPECT_EQ(n.outputs[0].dtype, DType::BF16);
      EXPECT_EQ(n.outputs[1].dtype, DType::F32);  // log-sum-exp
    }
  EXPECT_EQ(attention, cfg.num_hidden_layers);
}

// The bf16 step against the fp32 step on the same weights. bf16 keeps 8 significant bits
// (unit roundoff 2^-9 ~ 0.002); every stored activation and gradient is rounded once, and the
// ~20 roundings on a path through two layers (and the cancellations of the attention
// backward) add up to a few 1e-2 of a gradient's norm. fp32 modes agree to 1e-4
// (compile_modes_test), so a broken bf16 op (a wrong tile, a lost scale) shows up as an O(1)
// difference.
TEST(Bf16Graph, LossAndGradientsMatchFp32WithinBf16PrecisionInEveryMode) {
  for (bool tied : {false, true}) {
    ModelConfig cfg = tiny_config(tied, !tied, 2);
    cfg.vocab_size = 37;
    TrainingGraphOptions o;
    o.batch_size = 2;
    o.seq_len = 8;
    o.dtype = DType::F32;
    TrainingGraph ref_g = build_training_graph(cfg, o);
    o.dtype = DType::BF16;
    TrainingGraph bf_g = build_training_graph(cfg, o);
    const Batch batch = random_batch(2, 8, cfg.vocab_size, 5);
    const TensorMap inputs =
        batch_inputs(batch, DType::F32, 1.0 / double(batch.num_valid_labels()));
    EagerExecutor ref_exec(ref_g.graph);
    const auto ref = ref_exec.run(inputs, representable_params(ref_g.graph, DType::F32, 7));
    const TensorMap params = representable_params(bf_g.graph, DType::BF16, 7);
    std::vector<std::vector<Tensor>> by_mode;
    std::vector<double> errors;
    for (CompileMode mode : {CompileMode::None, CompileMode::Model, CompileMode::Full}) {
      PassOptions po;
      po.mode = mode;
      po.ce_chunk_budget_bytes = 5 * cfg.vocab_size * 4;  // several chunks
      po.tiled_head_ce_chunk_budget_bytes = po.ce_chunk_budget_bytes;
      CompiledStep step = compile_graph(bf_g.graph, po);
      auto out = step.executor->run(inputs, params);
      ASSERT_EQ(out.size(), ref.size());
      const std::string where =
          std::string(tied ? "tied" : "untied") + " compile " + compile_mode_name(mode);
      EXPECT_EQ(out[0].dtype(), DType::F32);
      EXPECT_LE(max_rel_diff(out[0], ref[0]), 5e-3) << where << " loss";
      for (size_t k = 1; k < out.size(); ++k) {
        EXPECT_EQ(out[k].dtype(), DType::BF16);
        const double e = rel_l2(out[k], ref[k]);
        errors.push_back(e);
        EXPECT_LE(e, 6e-2) << where << " " << bf_g.graph.outputs()[k].first;
      }
      by_mode.push_back(std::move(out));
    }
    // Typical gradients are off by ~1.5% (measured median 1.5%, worst 4%: the key bias,
    // whose exact gradient nearly cancels, softmax being shift-invariant).
    std::sort(errors.begin(), errors.end());
    EXPECT_LE(errors[errors.size() / 2], 2.5e-2);
    for (size_t m = 1; m < by_mode.size(); ++m)
      for (size_t k = 0; k < ref.size(); ++k)
        EXPECT_LE(rel_l2(by_mode[m][k], by_mode[0][k]), 6e-2)
            << "mode " << m << " vs eager, output " << k;
  }
}

// Recipes: full and LoRA training in bf16 run, save bf16 checkpoints (save_dtype defaults to
// the training dtype, so no fp32 master copy is needed) and resume exactly.
TEST(Bf16Recipes, FullFineTuneTrainsSavesBf16AndResumesExactly) {
  TempDir tmp;
  const Overrides bf16 = {{"dtype", "bf16"}, {"compile", "true"}, {"save_every_n_steps", "3"}};
  const CliRun full = run_shell(demo_command(tmp / "full", bf16), tmp / "s1");
  ASSERT_EQ(full.code, 0) << full.err;
  const std::vector<double> losses = losses_of(logged_steps(tmp / "full"));
  ASSERT_EQ(losses.size(), 6u);
  EXPECT_LT(losses.back(), losses.front());
  const std::string header = full.out + full.err;
  EXPECT_NE(header.find("bf16"), std::string::npos);
  // The checkpoint holds bf16 weights, and no master copy.
  auto ck = SafetensorsFile::open(tmp / "full" / "step_3" / "model.safetensors");
  for (const std::string& name : ck.names()) EXPECT_EQ(ck.info(name).dtype, DType::BF16) << name;
  auto state = SafetensorsFile::open(tmp / "full" / "step_3" / "recipe_state.safetensors");
  for (const std::string& name : state.names()) EXPECT_NE(name.rfind("master.", 0), 0u) << name;

  // Resume from step 3: steps 4-6 give the same losses bit for bit.
  std::filesystem::remove_all(tmp / "resumed");
  std::filesystem::create_directories(tmp / "resumed");
  std::filesystem::copy(tmp / "full" / "step_3", tmp / "resumed" / "step_3",
                        std::filesystem::copy_options::recursive);
  Overrides again = bf16;
  again["resume_from_checkpoint"] = "true";
  const CliRun resumed = run_shell(demo_command(tmp / "resumed", again), tmp / "s2");
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  const std::vector<double> tail = losses_of(logged_steps(tmp / "resumed"));
  ASSERT_EQ(tail.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(tail[i], losses[3 + i]) << "step " << 4 + i;
}

TEST(Bf16Recipes, Fp32AndBf16RunsFollowTheSameLossCurve) {
  TempDir tmp;
  std::vector<double> curves[2];
  int i = 0;
  for (const char* dt : {"fp32", "bf16"}) {
    const CliRun r = run_shell(demo_command(tmp / dt, {{"dtype", dt}, {"compile", "true"}}),
                               tmp / ("s" + std::string(dt)));
    ASSERT_EQ(r.code, 0) << r.err;
    curves[i++] = losses_of(logged_steps(tmp / dt));
  }
  ASSERT_EQ(curves[0].size(), curves[1].size());
  for (size_t s = 0; s < curves[0].size(); ++s)
    EXPECT_NEAR(curves[1][s], curves[0][s], 0.02 * curves[0][s]) << "step " << s + 1;
}
