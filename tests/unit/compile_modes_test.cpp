// Every compile mode computes what eager computes: the loss and every gradient, over several
// small configurations (GQA, tied/untied head, qkv bias, Qwen3's q/k norms, Gemma's GeGLU,
// (1 + w) norms and scaled embeddings, Gemma 2's post-norms, soft-caps and sliding window, packed
// documents, ignored labels).
#include <gtest/gtest.h>

#include <cmath>

#include "fusetune/compile/compiler.h"
#include "fusetune/compile/memory_estimate.h"
#include "fusetune/models/parameters.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/runtime/eager_executor.h"
#include "fusetune/util/error.h"
#include "graph_compare.h"
#include "tiny_models.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace {

struct ModeCase {
  const char* name;
  bool tied, bias, packed;
  int64_t kv;
  bool qwen3 = false;   // tiny_qwen3_config(): q/k norms, head_dim apart (tied, no bias)
  bool gemma = false;   // tiny_gemma_config(): GeGLU, (1 + w) norms, MQA (tied, no bias)
  bool gemma2 = false;  // tiny_gemma2_config(): post-norms, soft-caps, a window of 3
  bool gemma3 = false;  // tiny_gemma3_config(): q/k norms, two RoPE bases, no caps
  bool phi3 = false;    // tiny_phi3_config(): fused qkv_proj and gate_up_proj
};

void check_modes(const ModeCase& c, DType dt, double loss_tol, double grad_tol) {
  ModelConfig cfg = c.qwen3    ? tiny_qwen3_config()
                    : c.gemma  ? tiny_gemma_config()
                    : c.gemma2 ? tiny_gemma2_config()
                    : c.gemma3 ? tiny_gemma3_config()
                    : c.phi3   ? tiny_phi3_config()
                               : tiny_config(c.tied, c.bias, c.kv);
  cfg.vocab_size = 37;
  TrainingGraphOptions o;
  o.batch_size = 2;
  o.seq_len = 8;
  o.packed = c.packed;
  o.dtype = dt;
  TrainingGraph tg = build_training_graph(cfg, o);
  TensorMap params = init_parameters(graph_parameters(tg.graph), 11, dt, 0.2);
  Batch batch = random_batch(2, 8, cfg.vocab_size, 5, c.packed);
  TensorMap inputs = batch_inputs(batch, dt, 1.0 / double(batch.num_valid_labels()));

  EagerExecutor eager(tg.graph);
  auto ref = eager.run(inputs, params);
  for (CompileMode mode : {CompileMode::Model, CompileMode::Full}) {
    PassOptions po;
    po.mode = mode;
    po.ce_chunk_budget_bytes = 5 * cfg.vocab_size * int64_t(dtype_size(dt));  // several chunks
    CompiledStep step = compile_graph(tg.graph, po);
    auto out = step.executor->run(inputs, params);
    ASSERT_EQ(out.size(), ref.size());
    EXPECT_LE(max_rel_diff(out[0], ref[0]), loss_tol)
        << c.name << " mode " << compile_mode_name(mode) << " loss";
    for (size_t k = 1; k < out.size(); ++k)
      EXPECT_LE(max_rel_diff(out[k], ref[k]), grad_tol)
          << c.name << " mode " << compile_mode_name(mode) << " " << tg.graph.outputs()[k].first;
  }
}

const ModeCase kModeCases[] = {
    {"gqa_untied", false, false, false, 2},
    {"gqa_tied_bias", true, true, false, 2},
    {"mha_packed", false, false, true, 4},
    {"mqa_tied_packed", true, false, true, 1},
    {"qwen3_qk_norm_packed", true, false, true, 2, true},
    {"gemma_geglu_mqa_packed", true, false, true, 1, false, true},
    {"gemma2_softcaps_window", true, false, false, 1, false, false, true},
    {"gemma2_softcaps_window_packed", true, false, true, 1, false, false, true},
    {"gemma3_qk_norms_local_rope_packed", true, false, true, 1, false, false, false, true},
    {"phi3_fused_projections_packed", false, false, true, 2, false, false, false, false, true},
};

}  // namespace

TEST(CompileModes, MatchEagerInFloat64) {
  for (const ModeCase& c : kModeCases) check_modes(c, DType::F64, 1e-12, 1e-10);
}

TEST(CompileModes, MatchEagerInFloat32) {
  for (const ModeCase& c : kModeCases) check_modes(c, DType::F32, 1e-5, 1e-4);
}

TEST(CompileModes, FullModeRemovesTheLogitsAndModelModeKeepsThem) {
  ModelConfig cfg = tiny_config(false, false);
  TrainingGraphOptions o;
  o.batch_size = 2;
  o.seq_len = 4;
  TrainingGraph tg = build_training_graph(cfg, o);
  auto count = [](const Graph& g, Op op) {
    int n = 0;
    for (const Node& node : g.nodes()) n += node.op == op;
    return n;
  };
  PassOptions full;
  Graph gf = run_passes(tg.graph, full, nullptr);
  EXPECT_EQ(count(gf, Op::FusedLinearCrossEntropy), 1);
  EXPECT_EQ(count(gf, Op::LogSoftmax), 0);
  EXPECT_EQ(count(gf, Op::NllBackward), 0);
  for (const Node& n : gf.nodes())
    for (const auto& t : n.outputs) EXPECT_NE(t.shape, (Shape{8, cfg.vocab_size})) << op_name(n.op);
  PassOptions model;
  model.mode = CompileMode::Model;
  Graph gm = run_passes(tg.graph, model, nullptr);
  EXPECT_EQ(count(gm, Op::FusedLinearCrossEntropy), 0);
  EXPECT_EQ(count(gm, Op::LogSoftmax), 1);
}

// Gemma 2: compile: true takes the soft-caps into the fused kernels (flash attention with its
// window, the fused head), so no [N, V] logits and no [T, T] scores remain.
TEST(CompileModes, Gemma2SoftcapsLiveInsideTheFusedKernels) {
  ModelConfig cfg = tiny_gemma2_config();
  TrainingGraphOptions o;
  o.batch_size = 2;
  o.seq_len = 8;
  TrainingGraph tg = build_training_graph(cfg, o);
  auto count = [](const Graph& g, Op op) {
    int n = 0;
    for (const Node& node : g.nodes()) n += node.op == op;
    return n;
  };
  Graph gf = run_passes(tg.graph, PassOptions{}, nullptr);
  EXPECT_EQ(count(gf, Op::FusedLinearCrossEntropy), 1);
  EXPECT_EQ(count(gf, Op::FlashAttention), 3);
  EXPECT_EQ(count(gf, Op::FlashAttentionBackward), 3);
  EXPECT_EQ(count(gf, Op::Softcap) + count(gf, Op::SoftcapBackward), 0);
  int windowed = 0;
  for (const Node& n : gf.nodes()) {
    if (n.op == Op::FusedLinearCrossEntropy) {
      EXPECT_EQ(n.attrs.softcap, 1.5);
    }
    if (n.op == Op::FlashAttention) {
      EXPECT_EQ(n.attrs.softcap, 0.8);
      windowed += n.attrs.window == 3;
    }
    for (const auto& t : n.outputs)
      EXPECT_NE(t.shape, (Shape{16, cfg.vocab_size})) << op_name(n.op);
  }
  EXPECT_EQ(windowed, 2);  // layers 0 and 2
}

TEST(CompileModes, ParseModeNames) {
  EXPECT_EQ(parse_compile_mode("false"), CompileMode::None);
  EXPECT_EQ(parse_compile_mode("model"), CompileMode::Model);
  EXPECT_EQ(parse_compile_mode("true"), CompileMode::Full);
  EXPECT_EQ(parse_compile_mode("model+loss"), CompileMode::Full);
  EXPECT_THROW(parse_compile_mode("yes"), Error);
}

// Gemma's (1 + w) norms read a Fill of ones inside each layer: a leaf, never recomputed.
TEST(ActivationCheckpointing, GemmaSameLossAndGradientsInEveryMode) {
  ModelConfig cfg = tiny_gemma_config();
  TrainingGraphOptions o;
  o.batch_size = 2;
  o.seq_len = 8;
  o.dtype = DType::F64;
  TrainingGraph tg = build_training_graph(cfg, o);
  TensorMap params = init_parameters(graph_parameters(tg.graph), 4, DType::F64, 0.2);
  Batch batch = random_batch(2, 8, cfg.vocab_size, 6);
  TensorMap inputs = batch_inputs(batch, DType::F64, 1.0 / double(batch.num_valid_labels()));
  auto ref = EagerExecutor(tg.graph).run(inputs, params);
  for (CompileMode mode : {CompileMode::None, CompileMode::Model, CompileMode::Full}) {
    PassOptions po;
    po.mode = mode;
    po.activation_checkpointing = true;
    auto out = compile_graph(tg.graph, po).executor->run(inputs, params);
    ASSERT_EQ(out.size(), ref.size());
    for (size_t k = 0; k < out.size(); ++k)
      EXPECT_LE(max_rel_diff(out[k], ref[k]), 1e-12)
          << compile_mode_name(mode) << " " << tg.graph.outputs()[k].first;
  }
}

TEST(ActivationCheckpointing, SameLossAndGradientsWithLessActivationMemory) {
  ModelConfig cfg = tiny_config(false, true);
  cfg.num_hidden_layers = 3;
  TrainingGraphOptions o;
  o.batch_size = 2;
  o.seq_len = 8;
  o.dtype = DType::F64;
  TrainingGraph tg = build_training_graph(cfg, o);
  TensorMap params = init_parameters(graph_parameters(tg.graph), 4, DType::F64, 0.2);
  Batch batch = random_batch(2, 8, cfg.vocab_size, 6);
  TensorMap inputs = batch_inputs(batch, DType::F64, 1.0 / double(batch.num_valid_labels()));
  EagerExecutor eager(tg.graph);
  auto ref = eager.run(inputs, params);
  for (CompileMode mode : {CompileMode::None, CompileMode::Model, CompileMode::Full}) {
    PassOptions po;
    po.mode = mode;
    po.activation_checkpointing = true;
    std::vector<std::string> report;
    Graph g = run_passes(tg.graph, po, &report);
    EXPECT_NE(report.back().find("3 layers"), std::string::npos) << report.back();
    auto out = compile_graph(tg.graph, po).executor->run(inputs, params);
    for (size_t k = 0; k < out.size(); ++k)
      EXPECT_LE(max_rel_diff(out[k], ref[k]), 1e-12)
          << compile_mode_name(mode) << " " << tg.graph.outputs()[k].first;
  }
  // Less held at the peak: compare the planned activations with and without checkpointing.
  PassOptions plain, ckpt;
  ckpt.activation_checkpointing = true;
  Graph a = run_passes(tg.graph, plain, nullptr), b = run_passes(tg.graph, ckpt, nullptr);
  EXPECT_LT(estimate_step_memory(b, nullptr, 2).activations,
            estimate_step_memory(a, nullptr, 2).activations);
}
