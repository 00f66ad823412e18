// The fused linear + cross-entropy kernel on its own, and its pass alone against eager, in
// float64 with several chunks (the model-level tests run one chunk: the chunk size has a
// 16-row floor): loss, dh and dW, with ignored rows, a tied, a frozen and an NF4 head; a step
// where every label is ignored; a label outside the vocabulary; Gemma 2's soft-capped logits
// (kernel and pass, trainable and frozen head). Also the NF4 code book
// against the QLoRA paper's table.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "fusetune/compile/compiler.h"
#include "fusetune/graph/autodiff.h"
#include "fusetune/kernels/cpu/fused_linear_cross_entropy.h"
#include "fusetune/kernels/cpu/nf4.h"
#include "fusetune/losses/cross_entropy.h"
#include "fusetune/runtime/eager_executor.h"
#include "fusetune/util/error.h"
#include "graph_compare.h"
#include "nf4_support.h"
#include "tiny_models.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace {

struct Problem {
  int64_t N, D, V;
  std::vector<double> h, W;
  std::vector<int32_t> labels;
  Problem(int64_t n, int64_t d, int64_t v, uint64_t seed, int ignore_every = 4) : N(n), D(d), V(v) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u(-1, 1);
    for (int64_t i = 0; i < N * D; ++i) h.push_back(u(rng));
    for (int64_t i = 0; i < V * D; ++i) W.push_back(u(rng));
    for (int64_t i = 0; i < N; ++i)
      labels.push_back(ignore_every && i % ignore_every == 1 ? -100 : int32_t(rng() % V));
  }
  // scale * sum over labelled rows of (log sum_v exp(z_v) - z_y), from the definition; z is
  // capped to cap * tanh(z / cap) first when cap > 0.
  double loss(const std::vector<double>& hh, const std::vector<double>& ww, double scale,
              double cap = 0) const {
    double total = 0;
    for (int64_t i = 0; i < N; ++i) {
      if (labels[i] == -100) continue;
      double s = 0, zy = 0;
      for (int64_t v = 0; v < V; ++v) {
        double z = 0;
        for (int64_t d = 0; d < D; ++d) z += hh[i * D + d] * ww[v * D + d];
        if (cap > 0) z = cap * std::tanh(z / cap);
        s += std::exp(z);
        if (v == labels[i]) zy = z;
      }
      total += std::log(s) - zy;
    }
    return total * scale;
  }
};

TEST(FusedCrossEntropyKernel, LossAndGradientsOverSeveralChunksMatchTheDefinition) {
  const Problem p(13, 4, 7, 1);
  const double scale = 0.3;
  for (int64_t chunk : {1, 3, 5, 13}) {
    std::vector<double> dh(p.N * p.D), dW(p.V * p.D);
    const double loss = kernels::fused_linear_cross_entropy<double>(
        p.h.data(), p.W.data(), p.labels.data(), scale, p.N, p.D, p.V, chunk, dh.data(), dW.data());
    EXPECT_NEAR(loss, p.loss(p.h, p.W, scale), 1e-12) << "chunk " << chunk;
    const double eps = 1e-6;
    for (int64_t k = 0; k < p.N * p.D; ++k) {
      auto a = p.h, b = p.h;
      a[k] += eps;
      b[k] -= eps;
      EXPECT_NEAR(dh[k], (p.loss(a, p.W, scale) - p.loss(b, p.W, scale)) / (2 * eps), 1e-8)
          << "chunk " << chunk << " dh " << k;
      if (p.labels[k / p.D] == -100) {
        EXPECT_EQ(dh[k], 0.0);
      }
    }
    for (int64_t k = 0; k < p.V * p.D; ++k) {
      auto a = p.W, b = p.W;
      a[k] += eps;
      b[k] -= eps;
      EXPECT_NEAR(dW[k], (p.loss(p.h, a, scale) - p.loss(p.h, b, scale)) / (2 * eps), 1e-8)
          << "chunk " << chunk << " dW " << k;
    }
    // A frozen head: the same loss and dh, no dW.
    std::vector<double> dh_frozen(p.N * p.D);
    const double loss_frozen = kernels::fused_linear_cross_entropy<double>(
        p.h.data(), p.W.data(), p.labels.data(), scale, p.N, p.D, p.V, chunk, dh_frozen.data(),
        nullptr);
    EXPECT_EQ(loss_frozen, loss);
    EXPECT_EQ(dh_frozen, dh);
  }
}

// Gemma 2's final-logit soft-cap inside the kernel: |z| reaches about 4 here, so a cap of 0.9
// bends most logits.
TEST(FusedCrossEntropyKernel, SoftcappedLogitsOverSeveralChunksMatchTheDefinition) {
  const Problem p(13, 4, 7, 5);
  const double scale = 0.3, cap = 0.9, eps = 1e-6;
  for (int64_t chunk : {1, 3, 13}) {
    std::vector<double> dh(p.N * p.D), dW(p.V * p.D);
    const double loss = kernels::fused_linear_cross_entropy<double>(
        p.h.data(), p.W.data(), p.labels.data(), scale, p.N, p.D, p.V, chunk, dh.data(), dW.data(),
        cap);
    EXPECT_NEAR(loss, p.loss(p.h, p.W, scale, cap), 1e-12) << "chunk " << chunk;
    EXPECT_GT(std::abs(loss - p.loss(p.h, p.W, scale)), 0.1);  // the cap bites
    for (int64_t k = 0; k < p.N * p.D; ++k) {
      auto a = p.h, b = p.h;
      a[k] += eps;
      b[k] -= eps;
      EXPECT_NEAR(dh[k], (p.loss(a, p.W, scale, cap) - p.loss(b, p.W, scale, cap)) / (2 * eps),
                  1e-8)
          << "chunk " << chunk << " dh " << k;
    }
    for (int64_t k = 0; k < p.V * p.D; ++k) {
      auto a = p.W, b = p.W;
      a[k] += eps;
      b[k] -= eps;
      EXPECT_NEAR(dW[k], (p.loss(p.h, a, scale, cap) - p.loss(p.h, b, scale, cap)) / (2 * eps),
                  1e-8)
          << "chunk " << chunk << " dW " << k;
    }
  }
}

TEST(FusedCrossEntropyKernel, NF4HeadEqualsItsDequantizedDenseHead) {
  const Problem p(11, 64, 9, 2);  // rows of whole NF4 blocks
  const NF4Weight q = quantize_nf4(p.W, p.V, p.D);
  const kernels::NF4View w = q.view();
  const std::vector<double> dense = q.dequantized();
  std::vector<double> dh_nf4(p.N * p.D), dh_dense(p.N * p.D);
  const double a = kernels::fused_nf4_linear_cross_entropy<double>(p.h.data(), w, p.labels.data(),
                                                                   0.5, p.N, 3, dh_nf4.data());
  const double b = kernels::fused_linear_cross_entropy<double>(
      p.h.data(), dense.data(), p.labels.data(), 0.5, p.N, p.D, p.V, 3, dh_dense.data(), nullptr);
  EXPECT_NEAR(a, b, 1e-12);
  for (size_t i = 0; i < dh_nf4.size(); ++i) EXPECT_NEAR(dh_nf4[i], dh_dense[i], 1e-12);
}

TEST(FusedCrossEntropyKernel, EveryLabelIgnoredGivesZerosNotNan) {
  Problem p(6, 4, 5, 3);
  for (auto& y : p.labels) y = -100;
  std::vector<double> dh(p.N * p.D, 7.0), dW(p.V * p.D, 7.0);
  const double loss = kernels::fused_linear_cross_entropy<double>(
      p.h.data(), p.W.data(), p.labels.data(), 0.0, p.N, p.D, p.V, 2, dh.data(), dW.data());
  EXPECT_EQ(loss, 0.0);
  for (double x : dh) EXPECT_EQ(x, 0.0);
  for (double x : dW) EXPECT_EQ(x, 0.0);
}

TEST(FusedCrossEntropyKernel, ALabelOutsideTheVocabularyIsAnErrorNamingIt) {
  Problem p(6, 4, 5, 4);
  p.labels[4] = 5;
  std::vector<double> dh(p.N * p.D), dW(p.V * p.D);
  try {
    kernels::fused_linear_cross_entropy<double>(p.h.data(), p.W.data(), p.labels.data(), 1.0, p.N,
                                                p.D, p.V, 2, dh.data(), dW.data());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label 5 at token 4"), std::string::npos) << e.what();
  }
}

// The pass alone, on h [N, D] -> linear + cross-entropy, against eager in float64 with the
// chunk budget set so that N = 48 rows run as 3 chunks of 16.
void check_pass(bool trainable_head, bool tied, bool all_ignored, double softcap = 0) {
  const int64_t N = 48, D = 6, V = 11;
  Graph g(DType::F64);
  Builder b(g);
  Value h = g.param("h", {N, D}, true);
  Value W = g.param("W", {V, D}, trainable_head);
  Value labels = g.input("labels", {N}, DType::I32);
  Value scale = g.input("scale", {}, DType::F64);
  Value hidden = h;
  if (tied) {  // the head is also the embedding table the hidden states start from
    Value ids = g.input("ids", {N}, DType::I32);
    hidden = b.add(h, b.embedding(W, ids));
  }
  // Gemma 2: the model's soft-capped logits, then the loss.
  Value loss = softcap > 0
                   ? build_cross_entropy_from_logits(
                         b, b.softcap(b.matmul(hidden, W, false, true), softcap), labels, scale)
                   : build_cross_entropy(b, hidden, W, labels, scale);
  g.mark_output("loss", loss);
  append_backward(g, loss);

  Problem p(N, D, V, 9, 3);
  if (all_ignored)
    for (auto& y : p.labels) y = -100;
  TensorMap params{{"h", Tensor::empty({N, D}, DType::F64)},
                   {"W", Tensor::empty({V, D}, DType::F64)}};
  std::copy(p.h.begin(), p.h.end(), params["h"].data<double>());
  std::copy(p.W.begin(), p.W.end(), params["W"].data<double>());
  TensorMap in{{"labels", ids_tensor(p.labels, {N})},
               {"scale", scalar_tensor(all_ignored ? 0.0 : 1.0 / 32, DType::F64)}};
  std::vector<int32_t> ids(N);
  for (int64_t i = 0; i < N; ++i) ids[i] = int32_t((i * 7) % V);
  in["ids"] = ids_tensor(ids, {N});

  PassOptions po;
  po.ce_chunk_budget_bytes = 16 * V * 8;  // 16 rows of float64 logits
  Graph fused = run_passes(g, po, nullptr);
  int found = 0;
  for (const Node& n : fused.nodes())
    if (n.op == Op::FusedLinearCrossEntropy) {
      ++found;
      EXPECT_EQ(n.attrs.chunk_rows, 16);
      EXPECT_EQ(n.attrs.no_weight_grad, !trainable_head);
      EXPECT_EQ(n.attrs.softcap, softcap);
    }
  ASSERT_EQ(found, 1);
  const auto ref = EagerExecutor(g).run(in, params);
  const auto out = compile_graph(g, po).executor->run(in, params);
  ASSERT_EQ(out.size(), ref.size());
  for (size_t k = 0; k < out.size(); ++k) {
    EXPECT_LT(max_rel_diff(out[k], ref[k]), 1e-12) << g.outputs()[k].first;
    for (int64_t i = 0; i < out[k].numel(); ++i)
      ASSERT_TRUE(std::isfinite(out[k].data<double>()[i]));
  }
}

TEST(FuseLinearCrossEntropyPass, MatchesEagerOverSeveralChunks) { check_pass(true, false, false); }
TEST(FuseLinearCrossEntropyPass, FrozenHead) { check_pass(false, false, false); }
TEST(FuseLinearCrossEntropyPass, TiedHead) { check_pass(true, true, false); }
TEST(FuseLinearCrossEntropyPass, EveryLabelIgnored) { check_pass(true, false, true); }
TEST(FuseLinearCrossEntropyPass, SoftcappedLogitsTiedHead) { check_pass(true, true, false, 0.7); }
TEST(FuseLinearCrossEntropyPass, SoftcappedLogitsFrozenHead) {
  check_pass(false, false, false, 0.7);
}

TEST(NF4, CodeBookIsTheQLoRAPapersTable) {
  // Dettmers et al. 2023, QLoRA, Appendix E (NormalFloat 4-bit data type).
  const double expected[16] = {-1.0,
                               -0.6961928009986877,
                               -0.5250730514526367,
                               -0.39491748809814453,
                               -0.28444138169288635,
                               -0.18477343022823334,
                               -0.09105003625154495,
                               0.0,
                               0.07958029955625534,
                               0.16093020141124725,
                               0.24611230194568634,
                               0.33791524171829224,
                               0.44070982933044434,
                               0.5626170039176941,
                               0.7229568362236023,
                               1.0};
  for (int i = 0; i < 16; ++i) EXPECT_EQ(kernels::nf4_table()[i], float(expected[i])) << i;
}

}  // namespace
