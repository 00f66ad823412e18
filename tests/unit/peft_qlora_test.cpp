// QLoRA's frozen embedding and head in NF4: the fused linear + cross-entropy kernel with an NF4
// head against the dense kernel on the dequantized weights (float and double) and against
// finite differences of the hidden-state gradient (float64, kernel and compiled graph); the NF4
// embedding gather against the dequantized table; a tied model storing one matrix for both;
// every compile mode (with and without activation checkpointing) agreeing on QLoRA graphs; the
// frozen fp32 head fusing without a dW; and the memory estimate counting the NF4 weights and
// scratch within 10% of the measured peak.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "fusetune/compile/compiler.h"
#include "fusetune/compile/memory_estimate.h"
#include "fusetune/compile/memory_plan.h"
#include "fusetune/core/memory.h"
#include "fusetune/kernels/cpu/fused_linear_cross_entropy.h"
#include "fusetune/kernels/cpu/nf4.h"
#include "fusetune/models/parameters.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/optim/adamw.h"
#include "fusetune/peft/lora.h"
#include "fusetune/peft/nf4_weight.h"
#include "fusetune/util/error.h"
#include "gradcheck.h"
#include "graph_compare.h"
#include "peft_support.h"
#include "tiny_models.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace {

Tensor normal_matrix_f64(int64_t r, int64_t c, uint64_t seed, double std = 0.5) {
  Tensor t = Tensor::empty({r, c}, DType::F64);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n(0.0, std);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = n(rng);
  return t;
}

std::vector<int32_t> labels_with_ignored(int64_t N, int64_t V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> l(static_cast<size_t>(N));
  for (auto& y : l) y = rng() % 4 == 0 ? -100 : int32_t(rng() % uint64_t(V));
  return l;
}

peft::LoraConfig qlora_config(bool output = false) {
  peft::LoraConfig c;
  c.attn_modules = {"q_proj", "v_proj", "output_proj"};
  c.apply_to_mlp = true;
  c.apply_to_output = output;
  c.rank = 3;
  c.alpha = 6;
  c.quantize_base = true;
  return c;
}

struct Qlora {
  TensorMap params;
  std::shared_ptr<peft::NF4Store> store;
  TrainingGraph tg;
};

Qlora qlora_model(const ModelConfig& cfg, const peft::LoraConfig& c, DType dt, int64_t B, int64_t T,
                  bool packed = false) {
  Qlora q;
  TrainingGraph base = build_training_graph(cfg, TrainingGraphOptions{});
  q.params = init_parameters(graph_parameters(base.graph), 7, dt, 0.3);
  q.store = peft::quantize_base_weights(q.params, cfg);
  peft::init_adapters(q.params, cfg, c, 3, dt, q.store.get());
  perturb_adapters(q.params, 6);
  TrainingGraphOptions o;
  o.batch_size = B;
  o.seq_len = T;
  o.packed = packed;
  o.dtype = dt;
  o.trainable = peft::is_adapter_param;
  o.llama = peft::lora_llama_options(c, q.store);
  q.tg = build_training_graph(cfg, o);
  return q;
}

}  // namespace

// ---- the fused NF4 head kernel ------------------------------------------------------------

template <class T>
void check_fused_nf4_against_dense(double tol) {
  // (N, D, V, chunk): one tile of W rows; several tiles (D = 4096: 64-row tiles, the last
  // partial) with blocks of 64 straddling rows in the first case (D = 96).
  struct Case {
    int64_t N, D, V, chunk;
  };
  for (const Case& k : {Case{37, 96, 300, 8}, Case{10, 4096, 150, 4}}) {
    peft::NF4Weight q = peft::quantize_nf4(normal_matrix_f64(k.V, k.D, uint64_t(k.V)));
    Tensor wd = peft::dequantize_nf4(q, dtype_of<T>());
    Tensor h = random_tensor({k.N, k.D}, DType::F64, 5).to(dtype_of<T>());
    const std::vector<int32_t> labels = labels_with_ignored(k.N, k.V, 9);
    const T scale = T(1.0 / 7.0);
    Tensor dh = Tensor::empty({k.N, k.D}, dtype_of<T>());
    Tensor dh_ref = Tensor::empty({k.N, k.D}, dtype_of<T>());
    Tensor dh_ref_w = Tensor::empty({k.N, k.D}, dtype_of<T>());
    Tensor dW = Tensor::empty({k.V, k.D}, dtype_of<T>());
    const double loss = kernels::fused_nf4_linear_cross_entropy<T>(
        h.data<T>(), q.view(), labels.data(), scale, k.N, k.chunk, dh.data<T>());
    // The dense kernel on the dequantized W, with and without dW: same loss and dh.
    const double ref =
        kernels::fused_linear_cross_entropy<T>(h.data<T>(), wd.data<T>(), labels.data(), scale, k.N,
                                               k.D, k.V, k.chunk, dh_ref.data<T>(), nullptr);
    const double ref_w =
        kernels::fused_linear_cross_entropy<T>(h.data<T>(), wd.data<T>(), labels.data(), scale, k.N,
                                               k.D, k.V, k.chunk, dh_ref_w.data<T>(), dW.data<T>());
    EXPECT_NEAR(loss, ref, tol * std::abs(ref)) << "D " << k.D;
    EXPECT_EQ(ref, ref_w);
    EXPECT_LT(max_rel_diff(dh, dh_ref), tol) << "D " << k.D;
    EXPECT_EQ(max_rel_diff(dh_ref, dh_ref_w), 0.0);
    // Ignored rows get a zero gradient.
    for (int64_t r = 0; r < k.N; ++r) {
      if (labels[size_t(r)] != -100) continue;
      for (int64_t j = 0; j < k.D; ++j) EXPECT_EQ(double(dh.data<T>()[r * k.D + j]), 0.0);
    }
  }
}

TEST(QloraHead, FusedNf4CrossEntropyMatchesTheDenseKernelOnDequantizedWeights) {
  check_fused_nf4_against_dense<double>(1e-12);
  check_fused_nf4_against_dense<float>(1e-5);
}

TEST(QloraHead, FusedNf4HiddenGradientMatchesFiniteDifferencesInFloat64) {
  const int64_t N = 9, D = 96, V = 70;
  peft::NF4Weight q = peft::quantize_nf4(normal_matrix_f64(V, D, 2));
  Tensor h = random_tensor({N, D}, DType::F64, 3);
  const std::vector<int32_t> labels = labels_with_ignored(N, V, 4);
  Tensor dh = Tensor::empty({N, D}, DType::F64), scratch = Tensor::empty({N, D}, DType::F64);
  auto loss_at = [&](Tensor& x, Tensor& grad) {
    return kernels::fused_nf4_linear_cross_entropy<double>(
        x.data<double>(), q.view(), labels.data(), 0.25, N, 4, grad.data<double>());
  };
  loss_at(h, dh);
  double worst = 0;
  for (int64_t i = 0; i < h.numel(); i += 7) {
    double* x = h.data<double>() + i;
    const double x0 = *x, step = 1e-6;
    *x = x0 + step;
    const double lp = loss_at(h, scratch);
    *x = x0 - step;
    const double lm = loss_at(h, scratch);
    *x = x0;
    const double numeric = (lp - lm) / (2 * step);
    worst = std::max(worst,
                     std::abs(numeric - dh.data<double>()[i]) / std::max(1.0, std::abs(numeric)));
  }
  EXPECT_LT(worst, 1e-7);
}

// The head as a graph: h (a trainable leaf) -> NF4 head -> log_softmax -> nll. Compiled with
// the loss (compile: true) it is one FusedNF4LinearCrossEntropy; its dh agrees with eager
// (unfused NF4MatMul + NF4MatMulBackward) and, in float64, with finite differences.
TEST(QloraHead, CompiledGraphHiddenGradientMatchesEagerAndFiniteDifferences) {
  const int64_t N = 12, D = 80, V = 90;
  peft::NF4Weight q = peft::quantize_nf4(normal_matrix_f64(V, D, 8));
  const std::vector<int32_t> labels = labels_with_ignored(N, V, 5);
  for (DType dt : {DType::F64, DType::F32}) {
    Graph g(dt);
    Builder b(g);
    Value h = g.param("h", {N, D}, true);
    Value y = g.input("labels", {N}, DType::I32);
    Value scale = g.input("loss_scale", {}, dt);
    Value logits = peft::nf4_linear(b, h, q, "lm_head.weight");
    g.set_region(1);
    Value loss = b.mul(b.nll_sum(b.log_softmax(logits), y), scale);
    g.set_region(0);
    g.mark_output("loss", loss);
    append_backward(g, loss);
    TensorMap params, inputs;
    params["h"] = random_tensor({N, D}, DType::F64, 11).to(dt);
    inputs["labels"] = ids_tensor(labels, {N});
    inputs["loss_scale"] = scalar_tensor(0.125, dt);
    PassOptions po;
    po.mode = CompileMode::Full;
    po.ce_chunk_budget_bytes = 5 * V * int64_t(dtype_size(dt));
    po.tiled_head_ce_chunk_budget_bytes = po.ce_chunk_budget_bytes;
    Graph fused = run_passes(g, po, nullptr);
    EXPECT_EQ(count_ops(fused, Op::FusedNF4LinearCrossEntropy), 1);
    EXPECT_EQ(count_ops(fused, Op::NF4MatMul), 0);
    EXPECT_EQ(count_ops(fused, Op::LogSoftmax), 0);
    auto ref = EagerExecutor(g).run(inputs, params);
    CompiledStep step = compile_graph(g, po);
    auto out = step.executor->run(inputs, params);
    const double tol = dt == DType::F64 ? 1e-12 : 1e-5;
    EXPECT_LT(max_rel_diff(out[0], ref[0]), tol) << dtype_name(dt);
    EXPECT_LT(max_rel_diff(out[1], ref[1]), 10 * tol) << dtype_name(dt);
    if (dt != DType::F64) continue;
    double worst = 0;
    Tensor& p = params["h"];
    for (int64_t i = 0; i < p.numel(); i += 11) {
      double* x = p.data<double>() + i;
      const double x0 = *x;
      *x = x0 + 1e-6;
      const double lp = step.executor->run(inputs, params)[0].data<double>()[0];
      *x = x0 - 1e-6;
      const double lm = step.executor->run(inputs, params)[0].data<double>()[0];
      *x = x0;
      const double numeric = (lp - lm) / 2e-6;
      worst = std::max(
          worst, std::abs(numeric - out[1].data<double>()[i]) / std::max(1.0, std::abs(numeric)));
    }
    EXPECT_LT(worst, 1e-7);
  }
}

// ---- the NF4 embedding ----------------------------------------------------------------------

TEST(QloraEmbedding, StorageRoundTripAndGatherEqualTheDequantizedTable) {
  for (auto [V, D] : {std::pair<int64_t, int64_t>{50, 96}, {13, 16}, {7, 5}}) {
    Tensor table = normal_matrix_f64(V, D, uint64_t(V * D)).to(DType::F32);
    peft::NF4Weight q = peft::quantize_nf4(table);
    EXPECT_LT(double(q.nbytes()), 0.2 * double(table.nbytes()) + 64);
    Tensor full = peft::dequantize_nf4(q, DType::F32);
    // Storage round trip: every element within half the NF4 table's largest gap times its
    // block's absmax (plus the double-quantized absmax's own error).
    double half_gap = 0;
    for (int c = 0; c + 1 < 16; ++c)
      half_gap =
          std::max(half_gap, double(kernels::nf4_table()[c + 1] - kernels::nf4_table()[c]) / 2);
    for (int64_t b0 = 0; b0 < table.numel(); b0 += 64) {
      const int64_t b1 = std::min(table.numel(), b0 + 64);
      double am = 0;
      for (int64_t i = b0; i < b1; ++i) am = std::max(am, std::abs(double(table.data<float>()[i])));
      const double am_q = kernels::nf4_block_absmax(q.view(), b0 / 64);
      for (int64_t i = b0; i < b1; ++i)
        EXPECT_LE(std::abs(double(full.data<float>()[i]) - double(table.data<float>()[i])),
                  half_gap * am + std::abs(am_q - am) + 1e-6)
            << V << "x" << D << " element " << i;
    }
    const std::vector<int32_t> ids = {0, int32_t(V - 1), 3 % int32_t(V), 0, int32_t(V / 2), 1};
    for (DType dt : {DType::F32, DType::F64}) {
      Graph g(dt);
      Builder b(g);
      Value x = g.input("ids", {2, 3}, DType::I32);
      g.mark_output("rows", peft::nf4_embedding(b, x, q, "model.embed_tokens.weight"));
      TensorMap in;
      in["ids"] = ids_tensor(ids, {2, 3});
      Tensor rows = EagerExecutor(g).run(in, {})[0];
      ASSERT_EQ(rows.shape(), (Shape{2, 3, D}));
      Tensor ref = peft::dequantize_nf4(q, dt);
      for (size_t i = 0; i < ids.size(); ++i)
        for (int64_t j = 0; j < D; ++j)
          EXPECT_EQ(element_as_double(rows, int64_t(i) * D + j),
                    element_as_double(ref, int64_t(ids[i]) * D + j))
              << "token " << i << " col " << j;
      in["ids"] = ids_tensor({0, 1, int32_t(V), 0, 0, 0}, {2, 3});
      EXPECT_THROW(EagerExecutor(g).run(in, {}), Error);
    }
  }
}

TEST(QloraModel, EmbeddingAndHeadAreNf4AndATiedModelStoresOneMatrix) {
  for (bool tied : {false, true}) {
    ModelConfig cfg = tiny_config(tied, false);
    Qlora q = qlora_model(cfg, qlora_config(), DType::F32, 2, 8);
    EXPECT_FALSE(q.params.count("model.embed_tokens.weight"));
    EXPECT_FALSE(q.params.count("lm_head.weight"));
    EXPECT_TRUE(q.store->count("model.embed_tokens.weight"));
    EXPECT_EQ(q.store->count("lm_head.weight"), tied ? 0u : 1u);
    EXPECT_EQ(q.store->size(), size_t(7 * cfg.num_hidden_layers + (tied ? 1 : 2)));
    const Graph& g = q.tg.graph;
    EXPECT_EQ(count_ops(g, Op::NF4Embedding), 1);
    EXPECT_EQ(count_ops(g, Op::Embedding), 0);
    EXPECT_EQ(count_ops(g, Op::NF4MatMul), 7 * cfg.num_hidden_layers + 1);  // + the head
    for (const Node& n : g.nodes()) {
      if (n.op != Op::Param) continue;
      EXPECT_TRUE(n.name.find("norm") != std::string::npos || peft::is_adapter_param(n.name))
          << n.name;
    }
    // Tied: the embedding's and the head's constants are the same storage, counted once.
    const void* embed_codes = q.store->at("model.embed_tokens.weight").codes.raw();
    int uses = 0;
    for (const Node& n : g.nodes())
      if (n.op == Op::Constant && n.constant.raw() == embed_codes) ++uses;
    EXPECT_EQ(uses, tied ? 2 : 1);
    int64_t nf4_bytes = 0;
    for (const auto& [name, w] : *q.store) nf4_bytes += w.nbytes();
    int64_t param_bytes = 0;
    for (const Node& n : g.nodes())
      if (n.op == Op::Param) param_bytes += int64_t(n.outputs[0].nbytes());
    const MemoryBreakdown m = estimate_step_memory(g, nullptr, 2.0);
    int64_t other_constants = 0;  // RoPE tables
    for (const Node& n : g.nodes())
      if (n.op == Op::Constant && n.name.rfind("rope.", 0) == 0)
        other_constants += int64_t(n.constant.nbytes());
    EXPECT_EQ(m.parameters, param_bytes + nf4_bytes + other_constants) << "tied " << tied;
  }
}

// QLoRA (NF4 embedding, layers and head) equals LoRA on the dequantized weights, in float64
// (loss and every adapter gradient), untied and tied, with and without an adapter on the head.
TEST(QloraModel, EqualsLoraOnTheDequantizedWeightsInFloat64) {
  struct Case {
    bool tied, output;
  };
  for (const Case& k : {Case{false, false}, Case{true, false}, Case{false, true}}) {
    ModelConfig cfg = tiny_config(k.tied, false);
    const peft::LoraConfig c = qlora_config(k.output);
    Qlora q = qlora_model(cfg, c, DType::F64, 2, 6);
    Batch batch = random_batch(2, 6, cfg.vocab_size, 3);
    TensorMap inputs = batch_inputs(batch, DType::F64, 1.0 / double(batch.num_valid_labels()));
    auto out = EagerExecutor(q.tg.graph).run(inputs, q.params);
    TensorMap deq = q.params;
    for (const auto& [name, w] : *q.store) deq[name] = peft::dequantize_nf4(w, DType::F64);
    peft::LoraConfig plain = c;
    plain.quantize_base = false;
    TrainingGraphOptions o;
    o.batch_size = 2;
    o.seq_len = 6;
    o.dtype = DType::F64;
    o.trainable = peft::is_adapter_param;
    o.llama = peft::lora_llama_options(plain);
    TrainingGraph ref = build_training_graph(cfg, o);
    auto ref_out = EagerExecutor(ref.graph).run(inputs, deq);
    ASSERT_EQ(out.size(), ref_out.size());
    for (size_t j = 0; j < out.size(); ++j)
      EXPECT_LT(max_rel_diff(out[j], ref_out[j]), 1e-12)
          << "tied " << k.tied << " output " << k.output << " " << q.tg.graph.outputs()[j].first;
  }
}

TEST(QloraModel, AllCompileModesAgreeWithAndWithoutActivationCheckpointing) {
  struct Case {
    const char* name;
    bool tied, output, packed;
  };
  for (const Case& k : {Case{"untied", false, false, false}, Case{"tied", true, false, true},
                        Case{"head_adapter", false, true, false}}) {
    ModelConfig cfg = tiny_config(k.tied, false);
    cfg.vocab_size = 37;
    Qlora q = qlora_model(cfg, qlora_config(k.output), DType::F32, 2, 8, k.packed);
    Batch batch = random_batch(2, 8, cfg.vocab_size, 5, k.packed);
    TensorMap inputs = batch_inputs(batch, DType::F32, 1.0 / double(batch.num_valid_labels()));
    auto ref = EagerExecutor(q.tg.graph).run(inputs, q.params);
    for (bool ckpt : {false, true})
      for (CompileMode mode : {CompileMode::None, CompileMode::Model, CompileMode::Full}) {
        PassOptions po;
        po.mode = mode;
        po.activation_checkpointing = ckpt;
        po.ce_chunk_budget_bytes = 5 * cfg.vocab_size * 4;
        po.tiled_head_ce_chunk_budget_bytes = po.ce_chunk_budget_bytes;
        Graph compiled = run_passes(q.tg.graph, po, nullptr);
        const bool fuses = mode == CompileMode::Full && !k.output;
        EXPECT_EQ(count_ops(compiled, Op::FusedNF4LinearCrossEntropy), fuses ? 1 : 0) << k.name;
        EXPECT_EQ(count_ops(compiled, Op::FusedLinearCrossEntropy), 0) << k.name;
        auto out = compile_graph(q.tg.graph, po).executor->run(inputs, q.params);
        ASSERT_EQ(out.size(), ref.size());
        const std::string where =
            std::string(k.name) + " compile " + compile_mode_name(mode) + (ckpt ? " ckpt" : "");
        EXPECT_LE(max_rel_diff(out[0], ref[0]), 1e-5) << where << " loss";
        for (size_t j = 1; j < out.size(); ++j)
          EXPECT_LE(max_rel_diff(out[j], ref[j]), 1e-4)
              << where << " " << q.tg.graph.outputs()[j].first;
      }
  }
}

// LoRA's frozen fp32 head fuses with the loss without a dW: the node has no [V, D] output.
TEST(QloraHead, FrozenFloatHeadFusesWithoutWeightGradient) {
  ModelConfig cfg = tiny_config(false, false);
  peft::LoraConfig c = qlora_config();
  c.quantize_base = false;
  TrainingGraphOptions o;
  o.trainable = peft::is_adapter_param;
  o.llama = peft::lora_llama_options(c);
  TrainingGraph lora = build_training_graph(cfg, o);
  TrainingGraph full = build_training_graph(cfg, TrainingGraphOptions{});
  for (bool frozen : {true, false}) {
    Graph g = run_passes(frozen ? lora.graph : full.graph, PassOptions{}, nullptr);
    int fused = 0;
    for (const Node& n : g.nodes())
      if (n.op == Op::FusedLinearCrossEntropy) {
        ++fused;
        EXPECT_EQ(n.attrs.no_weight_grad, frozen);
        EXPECT_EQ(n.outputs.size(), frozen ? 2u : 3u);
      }
    EXPECT_EQ(fused, 1);
  }
}

// `fusetune plan`'s estimate for QLoRA steps (NF4 constants as parameters, NF4 tile and fused
// cross-entropy scratch as workspace) within 10% of the measured peak, in every mode.
TEST(QloraModel, PredictedPeakMatchesMeasuredInEveryMode) {
  ModelConfig cfg = tiny_config(false, false);
  cfg.vocab_size = 3000;
  cfg.hidden_size = 64;
  cfg.intermediate_size = 160;
  cfg.head_dim = 16;
  const int64_t B = 2, T = 64;
  for (bool tied : {false, true})
    for (bool ckpt : {false, true})
      for (CompileMode mode : {CompileMode::None, CompileMode::Model, CompileMode::Full}) {
        cfg.tie_word_embeddings = tied;
        const int64_t base = memory::current_bytes();
        int64_t measured = 0;
        MemoryBreakdown predicted;
        {
          Qlora q = qlora_model(cfg, qlora_config(), DType::F32, B, T);
          PassOptions po;
          po.mode = mode;
          po.activation_checkpointing = ckpt;
          po.ce_chunk_budget_bytes = 16 * cfg.vocab_size * 4;
          po.tiled_head_ce_chunk_budget_bytes = po.ce_chunk_budget_bytes;
          Graph run = run_passes(q.tg.graph, po, nullptr);
          MemoryPlan plan;
          if (mode != CompileMode::None)
            plan = plan_memory(run, mode == CompileMode::Model ? 1 : -1);
          predicted = estimate_step_memory(run, mode == CompileMode::None ? nullptr : &plan, 2.0);
          AdamW opt;
          CompiledStep step = compile_graph(q.tg.graph, po);
          Batch batch = random_batch(B, T, cfg.vocab_size, 9);
          TensorMap inputs =
              batch_inputs(batch, DType::F32, 1.0 / double(batch.num_valid_labels()));
          for (int s = 0; s < 2; ++s) {
            memory::reset_peak();
            std::vector<Tensor> out = step.executor->run(inputs, q.params);
            std::vector<ParamRef> refs;
            for (size_t i = 0; i < q.tg.trainable_params.size(); ++i)
              refs.push_back(
                  {q.tg.trainable_params[i], &q.params[q.tg.trainable_params[i]], &out[1 + i]});
            opt.step(refs, 1e-3);
            measured = memory::peak_bytes() - base;
          }
        }
        const double ratio = double(predicted.total()) / double(measured);
        EXPECT_NEAR(ratio, 1.0, 0.10)
            << "tied " << tied << " ckpt " << ckpt << " compile " << compile_mode_name(mode)
            << ": predicted " << predicted.total() << " measured " << measured;
      }
}
