// QAT under compile: true with the LM head fused: the fused linear + cross-entropy kernel with
// a fake-quantized head (fq(W) formed tile by tile inside the chunked GEMMs) against the
// definition on a weight fake-quantized whole first, over several tiles and chunks, fp32,
// float64 and bf16 storage; its gradients against float64 central differences (dh of the
// kernel itself; dW of the loss in fq(W), the straight-through estimator's gradient); the
// compile pass fusing the fake-quantized head of QAT models (gguf_q4_0, gguf_q8_0, torchao's
// 8da4w) and matching the unfused graph; and the gguf embedding fake-quantizing gathered rows.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "fusetune/compile/compiler.h"
#include "fusetune/kernels/cpu/bf16.h"
#include "fusetune/kernels/cpu/fake_quant.h"
#include "fusetune/kernels/cpu/fused_linear_cross_entropy.h"
#include "fusetune/models/parameters.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/quant/qat.h"
#include "fusetune/runtime/eager_executor.h"
#include "graph_compare.h"
#include "qat_models.h"
#include "tiny_models.h"

using namespace fusetune;
using namespace fusetune::testing;
namespace k = fusetune::kernels;

namespace {

std::vector<double> uniform(size_t n, uint64_t seed, double range) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-range, range);
  std::vector<double> v(n);
  for (double& x : v) x = u(rng);
  return v;
}

// Loss, dh and dW of scale * sum over labelled rows of (logsumexp(h_i Wq^T) - (h_i Wq^T)_y),
// written from the definition: softmax(z) - onehot(y) is dz.
struct HeadReference {
  double loss = 0;
  std::vector<double> dh, dW;
};
HeadReference head_reference(const std::vector<double>& h, const std::vector<double>& Wq,
                             const std::vector<int32_t>& labels, double scale, int64_t N, int64_t D,
                             int64_t V) {
  HeadReference r;
  r.dh.assign(size_t(N * D), 0.0);
  r.dW.assign(size_t(V * D), 0.0);
  std::vector<double> z(static_cast<size_t>(V));
  for (int64_t i = 0; i < N; ++i) {
    if (labels[size_t(i)] == -100) continue;
    double mx = -1e300;
    for (int64_t v = 0; v < V; ++v) {
      double s = 0;
      for (int64_t d = 0; d < D; ++d) s += h[size_t(i * D + d)] * Wq[size_t(v * D + d)];
      z[size_t(v)] = s;
      mx = std::max(mx, s);
    }
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(z[size_t(v)] - mx);
    r.loss += scale * (mx + std::log(sum) - z[size_t(labels[size_t(i)])]);
    for (int64_t v = 0; v < V; ++v) {
      const double dz =
          scale * (std::exp(z[size_t(v)] - mx) / sum - (v == labels[size_t(i)] ? 1.0 : 0.0));
      for (int64_t d = 0; d < D; ++d) {
        r.dh[size_t(i * D + d)] += dz * Wq[size_t(v * D + d)];
        r.dW[size_t(v * D + d)] += dz * h[size_t(i * D + d)];
      }
    }
  }
  return r;
}

template <class T>
double max_rel_to_reference(const std::vector<T>& a, const std::vector<double>& b) {
  double worst = 0, scale = 1e-30;
  for (double x : b) scale = std::max(scale, std::abs(x));
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - b[i]));
  return worst / scale;
}

std::vector<int32_t> labels_for(int64_t N, int64_t V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> y(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) y[size_t(i)] = i % 5 == 2 ? -100 : int32_t(rng() % uint64_t(V));
  return y;
}

const k::FakeQuantSpec kSpecs[] = {{k::FakeQuant::GgufQ8_0, 32},
                                   {k::FakeQuant::GgufQ4_0, 32},
                                   {k::FakeQuant::GgufQ6_K, 256},
                                   {k::FakeQuant::Int4Symmetric, 256}};

}  // namespace

TEST(FakeQuantFusedHeadKernel, EqualsTheDefinitionOnTheWholeFakeQuantizedWeight) {
  // D = 2048: 128 head rows per fake-quantized tile, so V = 300 is three tiles (the last one
  // partial); chunks of 8 of the 20 tokens, every fifth ignored.
  const int64_t N = 20, D = 2048, V = 300, chunk = 8;
  ASSERT_LT(k::fake_quant_tile_rows(V, D), V);
  const std::vector<double> h = uniform(size_t(N * D), 1, 0.05), W = uniform(size_t(V * D), 2, 1);
  const std::vector<int32_t> labels = labels_for(N, V, 3);
  const double scale = 1.0 / 16;
  for (const k::FakeQuantSpec& spec : kSpecs) {
    SCOPED_TRACE(k::fake_quant_name(spec.scheme));
    // float64: fq(W) whole, then the definition.
    std::vector<double> Wq(W.size());
    k::fake_quantize_rows<double>(spec, W.data(), Wq.data(), V, D);
    const HeadReference ref = head_reference(h, Wq, labels, scale, N, D, V);
    std::vector<double> dh(h.size()), dW(W.size());
    const double loss = k::fused_fake_quant_linear_cross_entropy<double>(
        spec, h.data(), W.data(), labels.data(), scale, N, D, V, chunk, dh.data(), dW.data());
    EXPECT_NEAR(loss, ref.loss, 1e-12 * std::abs(ref.loss));
    EXPECT_LE(max_rel_to_reference(dh, ref.dh), 1e-12);
    EXPECT_LE(max_rel_to_reference(dW, ref.dW), 1e-12);
    // fp32: the same to float rounding (fq rounds on fp32 values: compare with the fp32
    // weight fake-quantized whole).
    std::vector<float> hf(h.begin(), h.end()), Wf(W.begin(), W.end()), Wqf(W.size());
    k::fake_quantize_rows<float>(spec, Wf.data(), Wqf.data(), V, D);
    const HeadReference reff =
        head_reference(h, std::vector<double>(Wqf.begin(), Wqf.end()), labels, scale, N, D, V);
    std::vector<float> dhf(h.size()), dWf(W.size());
    const double lossf = k::fused_fake_quant_linear_cross_entropy<float>(
        spec, hf.data(), Wf.data(), labels.data(), float(scale), N, D, V, chunk, dhf.data(),
        dWf.data());
    EXPECT_NEAR(lossf, reff.loss, 1e-5 * std::abs(reff.loss));
    EXPECT_LE(max_rel_to_reference(dhf, reff.dh), 1e-5);
    EXPECT_LE(max_rel_to_reference(dWf, reff.dW), 1e-5);
    // bf16 storage: each tile widened, then fake-quantized: the fp32 kernel on the widened W.
    std::vector<uint16_t> Wb(W.size());
    std::vector<float> Ww(W.size());
    for (size_t i = 0; i < W.size(); ++i) Wb[i] = f32_to_bf16(Wf[i]), Ww[i] = bf16_to_f32(Wb[i]);
    std::vector<float> dhb(h.size()), dWb(W.size()), dhw(h.size()), dWw(W.size());
    const double lb = k::fused_fake_quant_bf16_linear_cross_entropy(
        spec, hf.data(), Wb.data(), labels.data(), float(scale), N, D, V, chunk, dhb.data(),
        dWb.data());
    const double lw = k::fused_fake_quant_linear_cross_entropy<float>(
        spec, hf.data(), Ww.data(), labels.data(), float(scale), N, D, V, chunk, dhw.data(),
        dWw.data());
    EXPECT_EQ(lb, lw);
    EXPECT_EQ(dhb, dhw);
    EXPECT_EQ(dWb, dWw);
  }
}

TEST(FakeQuantFusedHeadKernel, GradientsMatchFloat64FiniteDifferences) {
  // dh: central differences of the fused kernel's own loss in h (fq(W) does not depend on h).
  // dW: the straight-through estimator's gradient is the loss's gradient in fq(W): central
  // differences of the definition in each element of fq(W).
  const int64_t N = 7, D = 64, V = 11, chunk = 3;
  const std::vector<double> W = uniform(size_t(V * D), 5, 1);
  std::vector<double> h = uniform(size_t(N * D), 6, 0.3);
  const std::vector<int32_t> labels = labels_for(N, V, 7);
  const double scale = 0.25, eps = 1e-6;
  for (const k::FakeQuantSpec& spec :
       {kSpecs[0], kSpecs[1], k::FakeQuantSpec{k::FakeQuant::Int4Symmetric, 32}}) {
    SCOPED_TRACE(k::fake_quant_name(spec.scheme));
    std::vector<double> dh(h.size()), dW(W.size()), scratch_dh(h.size());
    auto kernel_loss = [&]() {
      return k::fused_fake_quant_linear_cross_entropy<double>(spec, h.data(), W.data(),
                                                              labels.data(), scale, N, D, V, chunk,
                                                              scratch_dh.data(), nullptr);
    };
    k::fused_fake_quant_linear_cross_entropy<double>(spec, h.data(), W.data(), labels.data(), scale,
                                                     N, D, V, chunk, dh.data(), dW.data());
    for (size_t i = 0; i < h.size(); i += 5) {
      const double v0 = h[i];
      h[i] = v0 + eps;
      const double lp = kernel_loss();
      h[i] = v0 - eps;
      const double lm = kernel_loss();
      h[i] = v0;
      const double fd = (lp - lm) / (2 * eps);
      EXPECT_NEAR(dh[i], fd, 1e-7 * (1 + std::abs(fd))) << "dh " << i;
    }
    std::vector<double> Wq(W.size());
    k::fake_quantize_rows<double>(spec, W.data(), Wq.data(), V, D);
    for (size_t i = 0; i < Wq.size(); i += 7) {
      const double v0 = Wq[i];
      Wq[i] = v0 + eps;
      const double lp = head_reference(h, Wq, labels, scale, N, D, V).loss;
      Wq[i] = v0 - eps;
      const double lm = head_reference(h, Wq, labels, scale, N, D, V).loss;
      Wq[i] = v0;
      const double fd = (lp - lm) / (2 * eps);
      EXPECT_NEAR(dW[i], fd, 1e-7 * (1 + std::abs(fd))) << "dW " << i;
    }
  }
}

namespace {

int fused_fake_quant_heads(const Graph& g) {
  int n = 0;
  for (const Node& node : g.nodes())
    n += node.op == Op::FusedLinearCrossEntropy && node.inputs.size() == 5;
  return n;
}

}  // namespace

TEST(FakeQuantFusedHead, CompileTrueFusesTheFakeQuantizedHeadAndMatchesTheUnfusedGraph) {
  struct Case {
    quant::QatScheme scheme;
    bool tied;
    int64_t hidden = 32;
  };
  // The torchao scheme quantizes an untied head only (a tied one stays float and fuses as
  // before); the gguf schemes quantize the head (Q8_0; gguf_q4_0 with hidden 256: Q6_K on Q8_K
  // activations, super-blocks of 256 along the reduction dimension) tied or not.
  const Case cases[] = {
      {quant::QatScheme::GgufQ4_0, false},      {quant::QatScheme::GgufQ4_0, true},
      {quant::QatScheme::GgufQ4_0, false, 256}, {quant::QatScheme::GgufQ4_0, true, 256},
      {quant::QatScheme::GgufQ8_0, false},      {quant::QatScheme::Int8DynActInt4Weight, false}};
  for (const Case& c : cases)
    for (DType dt : {DType::F64, DType::F32})
      for (int on : {1, 0}) {
        SCOPED_TRACE(std::string(quant::scheme_name(c.scheme)) + (c.tied ? " tied " : " untied ") +
                     dtype_name(dt) + (on ? " on" : " off") + " hidden " +
                     std::to_string(c.hidden));
        const ModelConfig cfg = qat_model_config(c.tied, c.hidden);
        quant::QatConfig q;
        q.scheme = c.scheme;
        q.groupsize = 16;
        TrainingGraphOptions o;
        o.batch_size = 2;
        o.seq_len = 16;
        o.dtype = dt;
        o.llama = quant::qat_llama_options(q, std::make_shared<ModelConfig>(cfg), true);
        TrainingGraph tg = build_training_graph(cfg, o);
        PassOptions po;
        po.mode = CompileMode::Full;
        po.ce_chunk_budget_bytes = 16 * cfg.vocab_size * int64_t(dtype_size(dt));  // 2 chunks
        po.tiled_head_ce_chunk_budget_bytes = po.ce_chunk_budget_bytes;
        const Graph fused = run_passes(tg.graph, po, nullptr);
        EXPECT_EQ(fused_fake_quant_heads(fused), 1);
        for (const Node& n : fused.nodes())
          if (n.op == Op::FusedLinearCrossEntropy && n.inputs.size() == 5 &&
              c.scheme == quant::QatScheme::GgufQ4_0) {
            EXPECT_EQ(n.attrs.groups,
                      int64_t(c.hidden == 256 ? k::FakeQuant::GgufQ6_K : k::FakeQuant::GgufQ8_0));
          }
        EXPECT_EQ(count_ops(fused, Op::LogSoftmax), 0);           // no [tokens x vocab] logits
        EXPECT_EQ(count_ops(fused, Op::FakeQuantMatMul), 7 * 2);  // the layers' only

        TensorMap params = init_parameters(graph_parameters(tg.graph), 3, dt, 0.2);
        const Batch batch = random_batch(2, 16, cfg.vocab_size, 4);
        const TensorMap inputs =
            with_enable(batch_inputs(batch, dt, 1.0 / double(batch.num_valid_labels())), on);
        // The unfused references: eager, and compile: model, whose model region is compiled
        // as under compile: true (so the head's input is the same to the bit in fp32) while
        // the head and loss run unfused.
        const auto eager = EagerExecutor(tg.graph).run(inputs, params);
        PassOptions model_only = po;
        model_only.mode = CompileMode::Model;
        const auto unfused = compile_graph(tg.graph, model_only).executor->run(inputs, params);
        const auto out = compile_graph(tg.graph, po).executor->run(inputs, params);
        ASSERT_EQ(out.size(), eager.size());
        const double tol = dt == DType::F64 ? 1e-10 : 1e-5;
        for (size_t i = 0; i < out.size(); ++i) {
          EXPECT_LE(max_rel_diff(out[i], unfused[i]), tol) << tg.graph.outputs()[i].first;
          // eager's fp32 layers round differently (the same bound as the compile-modes test)
          EXPECT_LE(max_rel_diff(out[i], eager[i]), i == 0 || dt == DType::F64 ? tol : 1e-4)
              << tg.graph.outputs()[i].first;
        }
      }
}
