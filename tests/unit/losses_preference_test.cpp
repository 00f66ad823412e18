// Preference losses (losses/preference.h) and the fused label log-prob kernel and pass
// (kernels/cpu/fused_linear_log_probs.h, compile/fuse_linear_log_probs.h), each against an
// independent formulation written out here in double precision, against float64 finite
// differences, and across the three compile modes.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "fusetune/compile/compiler.h"
#include "fusetune/graph/autodiff.h"
#include "fusetune/kernels/cpu/fused_linear_log_probs.h"
#include "fusetune/kernels/cpu/nf4.h"
#include "fusetune/losses/preference.h"
#include "fusetune/models/parameters.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/runtime/eager_executor.h"
#include "fusetune/util/error.h"
#include "gradcheck.h"
#include "graph_compare.h"
#include "nf4_support.h"
#include "tiny_models.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace {

// ---- the fused kernel against a direct double computation ---------------------------------

struct LogProbProblem {
  int64_t N = 11, D = 5, V = 9;
  std::vector<double> h, W;
  std::vector<int32_t> labels;
  double cap = 0;  // > 0: Gemma 2's soft-capped logits, cap * tanh(z / cap)
  explicit LogProbProblem(uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u(-1, 1);
    for (int64_t i = 0; i < N * D; ++i) h.push_back(u(rng));
    for (int64_t i = 0; i < V * D; ++i) W.push_back(u(rng));
    for (int64_t i = 0; i < N; ++i) labels.push_back(i % 4 == 2 ? -100 : int32_t(rng() % V));
  }
  double logit(const std::vector<double>& hh, const std::vector<double>& ww, int64_t i,
               int64_t v) const {
    double z = 0;
    for (int64_t d = 0; d < D; ++d) z += hh[i * D + d] * ww[v * D + d];
    return cap > 0 ? cap * std::tanh(z / cap) : z;
  }
  // log p(label_i) written from the definition: z_y - log sum_v exp(z_v).
  double logp(const std::vector<double>& hh, const std::vector<double>& ww, int64_t i) const {
    double s = 0;
    for (int64_t v = 0; v < V; ++v) s += std::exp(logit(hh, ww, i, v));
    return logit(hh, ww, i, labels[i]) - std::log(s);
  }
  // f = sum_i g_i log p(label_i), the scalar whose gradient the backward computes.
  double f(const std::vector<double>& hh, const std::vector<double>& ww,
           const std::vector<double>& g) const {
    double s = 0;
    for (int64_t i = 0; i < N; ++i)
      if (labels[i] != -100) s += g[i] * logp(hh, ww, i);
    return s;
  }
};

TEST(FusedLinearLogProbs, ForwardMatchesTheDefinitionOverSeveralChunks) {
  LogProbProblem p(1);
  for (int64_t chunk : {1, 3, 4, 100}) {
    std::vector<double> logp(p.N), lse(p.N), zsum(p.N);
    kernels::LogProbHead<double> head{p.W.data(), nullptr, p.V, p.D};
    kernels::fused_linear_log_probs<double>(p.h.data(), p.labels.data(), head, p.N, chunk,
                                            logp.data(), lse.data(), zsum.data());
    for (int64_t i = 0; i < p.N; ++i) {
      if (p.labels[i] == -100) {
        EXPECT_EQ(logp[i], 0.0);
        EXPECT_EQ(zsum[i], 0.0);
        continue;
      }
      double s = 0;
      for (int64_t v = 0; v < p.V; ++v) s += p.logit(p.h, p.W, i, v);
      EXPECT_NEAR(logp[i], p.logp(p.h, p.W, i), 1e-12) << "chunk " << chunk << " row " << i;
      EXPECT_NEAR(zsum[i], s, 1e-12);
      EXPECT_NEAR(lse[i], p.logit(p.h, p.W, i, p.labels[i]) - logp[i], 1e-12);
    }
  }
}

void check_log_probs_backward(double cap) {
  LogProbProblem p(2);
  p.cap = cap;
  std::vector<double> g(p.N);
  for (int64_t i = 0; i < p.N; ++i) g[i] = 0.3 + 0.1 * double(i % 5) - (i % 2 ? 0.7 : 0.0);
  for (int64_t chunk : {2, 5}) {
    std::vector<double> logp(p.N), lse(p.N), zsum(p.N), dh(p.N * p.D), dW(p.V * p.D);
    kernels::LogProbHead<double> head{p.W.data(), nullptr, p.V, p.D};
    head.softcap = cap;
    kernels::fused_linear_log_probs<double>(p.h.data(), p.labels.data(), head, p.N, chunk,
                                            logp.data(), lse.data(), zsum.data());
    if (cap > 0) {  // the capped forward against the definition
      for (int64_t i = 0; i < p.N; ++i) {
        if (p.labels[i] != -100) {
          EXPECT_NEAR(logp[i], p.logp(p.h, p.W, i), 1e-12) << "row " << i;
        }
      }
    }
    kernels::fused_linear_log_probs_backward<double>(
        p.h.data(), p.labels.data(), lse.data(), g.data(), head, p.N, chunk, dh.data(), dW.data());
    const double eps = 1e-6;
    for (int64_t k = 0; k < p.N * p.D; ++k) {
      auto hp = p.h, hm = p.h;
      hp[k] += eps;
      hm[k] -= eps;
      EXPECT_NEAR(dh[k], (p.f(hp, p.W, g) - p.f(hm, p.W, g)) / (2 * eps), 1e-7) << "dh " << k;
    }
    for (int64_t k = 0; k < p.V * p.D; ++k) {
      auto wp = p.W, wm = p.W;
      wp[k] += eps;
      wm[k] -= eps;
      EXPECT_NEAR(dW[k], (p.f(p.h, wp, g) - p.f(p.h, wm, g)) / (2 * eps), 1e-7) << "dW " << k;
    }
    // A frozen head: the same dh, no dW; and the frozen route (E_p[W] kept by the forward,
    // no GEMM in the backward) gives that dh too.
    std::vector<double> dh2(p.N * p.D);
    kernels::fused_linear_log_probs_backward<double>(
        p.h.data(), p.labels.data(), lse.data(), g.data(), head, p.N, chunk, dh2.data(), nullptr);
    EXPECT_EQ(dh, dh2);
    std::vector<double> expect(p.N * p.D), logp3(p.N), lse3(p.N), zsum3(p.N), dh3(p.N * p.D);
    kernels::fused_linear_log_probs<double>(p.h.data(), p.labels.data(), head, p.N, chunk,
                                            logp3.data(), lse3.data(), zsum3.data(), expect.data());
    EXPECT_EQ(logp3, logp);
    kernels::fused_linear_log_probs_backward_frozen<double>(p.labels.data(), expect.data(),
                                                            g.data(), head, p.N, dh3.data());
    for (size_t k = 0; k < dh.size(); ++k) EXPECT_NEAR(dh3[k], dh[k], 1e-12) << "frozen dh " << k;
  }
}

TEST(FusedLinearLogProbs, BackwardMatchesFiniteDifferencesOverSeveralChunks) {
  check_log_probs_backward(0);
}

// One chunk (N <= chunk_rows): the forward may form its logits in a buffer it hands to the
// backward, which then skips their recomputation; every output is the recomputing route's bits.
TEST(FusedLinearLogProbs, KeptLogitsGiveTheRecomputingBackwardsBitsInOneChunk) {
  LogProbProblem p(3);
  std::vector<double> g(p.N);
  for (int64_t i = 0; i < p.N; ++i) g[i] = 0.2 + 0.1 * double(i % 3) - (i % 2 ? 0.5 : 0.0);
  const kernels::LogProbHead<double> head{p.W.data(), nullptr, p.V, p.D};
  for (int64_t chunk : {p.N, p.N + 5}) {
    std::vector<double> logp(p.N), lse(p.N), zsum(p.N), dh(p.N * p.D), dW(p.V * p.D);
    kernels::fused_linear_log_probs<double>(p.h.data(), p.labels.data(), head, p.N, chunk,
                                            logp.data(), lse.data(), zsum.data());
    kernels::fused_linear_log_probs_backward<double>(
        p.h.data(), p.labels.data(), lse.data(), g.data(), head, p.N, chunk, dh.data(), dW.data());
    std::vector<double> z(p.N * p.V, -7.0), logp2(p.N), lse2(p.N), zsum2(p.N);
    std::vector<double> dh2(p.N * p.D, 5.0), dW2(p.V * p.D, 5.0);
    kernels::fused_linear_log_probs<double>(p.h.data(), p.labels.data(), head, p.N, chunk,
                                            logp2.data(), lse2.data(), zsum2.data(), nullptr,
                                            z.data());
    EXPECT_EQ(logp2, logp);
    EXPECT_EQ(lse2, lse);
    EXPECT_EQ(zsum2, zsum);
    // The kept rows are the labelled rows' logits, in order.
    for (int64_t i = 0, row = 0; i < p.N; ++i) {
      if (p.labels[i] == -100) continue;
      for (int64_t v = 0; v < p.V; ++v)
        EXPECT_NEAR(z[row * p.V + v], p.logit(p.h, p.W, i, v), 1e-12) << i << " " << v;
      ++row;
    }
    kernels::fused_linear_log_probs_backward<double>(p.h.data(), p.labels.data(), lse.data(),
                                                     g.data(), head, p.N, chunk, dh2.data(),
                                                     dW2.data(), z.data());
    EXPECT_EQ(dh2, dh) << "chunk " << chunk;
    EXPECT_EQ(dW2, dW) << "chunk " << chunk;
  }
  // Several chunks cannot keep their logits (each chunk's would be overwritten by the next).
  std::vector<double> z(p.N * p.V), logp(p.N), lse(p.N), zsum(p.N);
  EXPECT_THROW(kernels::fused_linear_log_probs<double>(p.h.data(), p.labels.data(), head, p.N,
                                                       p.N - 1, logp.data(), lse.data(),
                                                       zsum.data(), nullptr, z.data()),
               Error);
}

// Gemma 2's final-logit soft-cap inside the kernels (|z| reaches about 3: a cap of 0.8 bites),
// the frozen route's E_p[W] included.
TEST(FusedLinearLogProbs, SoftcappedLogitsBackwardMatchesFiniteDifferences) {
  check_log_probs_backward(0.8);
}

TEST(FusedLinearLogProbs, NF4HeadEqualsItsDequantizedDenseHead) {
  LogProbProblem p(3);
  p.D = 64;  // whole NF4 blocks per row
  p.W.clear();
  p.h.clear();
  std::mt19937_64 rng(4);
  std::uniform_real_distribution<double> u(-1, 1);
  for (int64_t i = 0; i < p.V * p.D; ++i) p.W.push_back(u(rng));
  for (int64_t i = 0; i < p.N * p.D; ++i) p.h.push_back(u(rng));
  const NF4Weight q = quantize_nf4(p.W, p.V, p.D);
  const kernels::NF4View w = q.view();
  const std::vector<double> dense = q.dequantized();
  std::vector<double> g(p.N, 0.5);
  auto run = [&](const kernels::LogProbHead<double>& head, std::vector<double>& logp,
                 std::vector<double>& dh) {
    std::vector<double> lse(p.N), zsum(p.N);
    kernels::fused_linear_log_probs<double>(p.h.data(), p.labels.data(), head, p.N, 4, logp.data(),
                                            lse.data(), zsum.data());
    kernels::fused_linear_log_probs_backward<double>(p.h.data(), p.labels.data(), lse.data(),
                                                     g.data(), head, p.N, 4, dh.data(), nullptr);
  };
  std::vector<double> logp_a(p.N), logp_b(p.N), dh_a(p.N * p.D), dh_b(p.N * p.D);
  run({nullptr, &w, p.V, p.D}, logp_a, dh_a);
  run({dense.data(), nullptr, p.V, p.D}, logp_b, dh_b);
  for (int64_t i = 0; i < p.N; ++i) EXPECT_NEAR(logp_a[i], logp_b[i], 1e-12);
  for (size_t i = 0; i < dh_a.size(); ++i) EXPECT_NEAR(dh_a[i], dh_b[i], 1e-12);
  // The frozen route on the NF4 head (the label rows dequantized one at a time).
  std::vector<double> logp_c(p.N), lse(p.N), zsum(p.N), expect(p.N * p.D), dh_c(p.N * p.D);
  const kernels::LogProbHead<double> nf4_head{nullptr, &w, p.V, p.D};
  kernels::fused_linear_log_probs<double>(p.h.data(), p.labels.data(), nf4_head, p.N, 4,
                                          logp_c.data(), lse.data(), zsum.data(), expect.data());
  kernels::fused_linear_log_probs_backward_frozen<double>(p.labels.data(), expect.data(), g.data(),
                                                          nf4_head, p.N, dh_c.data());
  for (size_t i = 0; i < dh_a.size(); ++i) EXPECT_NEAR(dh_c[i], dh_b[i], 1e-12);
}

TEST(FusedLinearLogProbs, RejectsALabelOutsideTheVocabulary) {
  LogProbProblem p(5);
  p.labels[3] = int32_t(p.V);
  std::vector<double> logp(p.N), lse(p.N), zsum(p.N);
  kernels::LogProbHead<double> head{p.W.data(), nullptr, p.V, p.D};
  EXPECT_THROW(kernels::fused_linear_log_probs<double>(p.h.data(), p.labels.data(), head, p.N, 4,
                                                       logp.data(), lse.data(), zsum.data()),
               Error);
}

// ---- the losses against their papers' formulas, and their gradients -----------------------

// KTO's KL reference point in these tests (an input of its loss).
constexpr double kKtoKl = 0.3;

double log_sigmoid(double x) {
  return x < 0 ? x - std::log1p(std::exp(x)) : -std::log1p(std::exp(-x));
}

// The expected mean loss over B pairs, written from each paper's formula.
double reference_loss(const PreferenceLoss& l, const std::vector<double>& pol,
                      const std::vector<double>& ref, const std::vector<double>& len) {
  const size_t B = pol.size() / 2;
  double total = 0;
  for (size_t i = 0; i < B; ++i) {
    double v = 0;
    if (l.kind == PreferenceLossKind::KTO) {  // Ethayarajh et al. 2024, eq. 7-8
      const double z = kKtoKl, rc = pol[i] - ref[i], rr = pol[B + i] - ref[B + i];
      const double vc = 1 - 1 / (1 + std::exp(-l.beta * (rc - z)));
      const double vr = 1 - 1 / (1 + std::exp(-l.beta * (z - rr)));
      v = (l.desirable_weight * vc + l.undesirable_weight * vr) / 2;  // the mean of 2 examples
    } else if (l.kind ==
               PreferenceLossKind::ORPO) {  // Hong et al. 2024, eq. 6-8, with mean log-probs
      const double pc = std::exp(pol[i] / len[i]), pr = std::exp(pol[B + i] / len[B + i]);
      const double odds_ratio = (pc / (1 - pc)) / (pr / (1 - pr));
      v = -std::log(pc) - l.beta * std::log(1 / (1 + 1 / odds_ratio));
    } else if (l.kind == PreferenceLossKind::SimPO) {
      const double d = pol[i] / len[i] - pol[B + i] / len[B + i] - l.gamma / l.beta;
      v = -(1 - l.label_smoothing) * log_sigmoid(l.beta * d) -
          l.label_smoothing * log_sigmoid(-l.beta * d);
    } else {
      const double d = (pol[i] - pol[B + i]) - (ref[i] - ref[B + i]);
      switch (l.kind) {
        case PreferenceLossKind::DPO:
          v = -(1 - l.label_smoothing) * log_sigmoid(l.beta * d) -
              l.label_smoothing * log_sigmoid(-l.beta * d);
          break;
        case PreferenceLossKind::RSO:
          v = std::max(0.0, 1 - l.gamma * d);
          break;
        case PreferenceLossKind::IPO:
          v = (d - 1 / (2 * l.tau)) * (d - 1 / (2 * l.tau));
          break;
        default:
          break;
      }
    }
    total += v;
  }
  return total / double(B);
}

std::vector<PreferenceLoss> all_losses() {
  PreferenceLoss dpo, cdpo, rso, ipo, simpo, orpo, kto;
  dpo.beta = 0.5;
  cdpo.beta = 0.3;
  cdpo.label_smoothing = 0.2;
  rso.kind = PreferenceLossKind::RSO;
  rso.gamma = 0.4;
  ipo.kind = PreferenceLossKind::IPO;
  ipo.tau = 0.7;
  simpo.kind = PreferenceLossKind::SimPO;
  simpo.beta = 2.0;
  simpo.gamma = 0.5;
  simpo.label_smoothing = 0.1;
  orpo.kind = PreferenceLossKind::ORPO;
  orpo.beta = 0.3;
  kto.kind = PreferenceLossKind::KTO;
  kto.beta = 0.4;
  kto.desirable_weight = 1.5;
  kto.undesirable_weight = 0.8;
  return {dpo, cdpo, rso, ipo, simpo, orpo, kto};
}

TEST(PreferenceLoss, ValueAndGradientsMatchTheFormulasAndFiniteDifferences) {
  const int64_t B = 3;
  const std::vector<double> pol = {-4.0, -2.5, -7.0, -5.0, -2.0, -6.5};
  const std::vector<double> ref = {-4.5, -2.0, -6.0, -4.0, -2.2, -6.0};
  const std::vector<double> len = {4, 3, 7, 5, 2, 9};
  for (const PreferenceLoss& l : all_losses()) {
    Graph g(DType::F64);
    Builder b(g);
    Value p = g.param("policy", {2 * B}, true);
    Value r = g.input("ref", {2 * B}, DType::F64);
    Value inv = g.input("inv_len", {2 * B}, DType::F64);
    Value scale = g.input("scale", {}, DType::F64);
    Value kl = l.kind == PreferenceLossKind::KTO ? g.input("kl", {}, DType::F64) : Value{};
    PreferenceLossOutputs out = build_preference_loss(b, l, p, r, inv, scale, kl);
    g.mark_output("loss", out.loss);
    TensorMap params{{"policy", Tensor::empty({2 * B}, DType::F64)}};
    TensorMap in{{"ref", Tensor::empty({2 * B}, DType::F64)},
                 {"inv_len", Tensor::empty({2 * B}, DType::F64)},
                 {"scale", scalar_tensor(1.0 / double(B), DType::F64)},
                 {"kl", scalar_tensor(kKtoKl, DType::F64)}};
    for (int64_t i = 0; i < 2 * B; ++i) {
      params["policy"].data<double>()[i] = pol[size_t(i)];
      in["ref"].data<double>()[i] = ref[size_t(i)];
      in["inv_len"].data<double>()[i] = 1.0 / len[size_t(i)];
    }
    EagerExecutor ex(g);
    EXPECT_NEAR(ex.run(in, params)[0].data<double>()[0], reference_loss(l, pol, ref, len), 1e-12)
        << l.name();
    check_gradients(g, out.loss, params, in, 12, 1e-7);
  }
}

// KTO on unpaired rows (TRL's prompt / completion / label data): each row is one example of the
// kind its mask says, and the loss is the mean over the rows of Ethayarajh et al. 2024's
// per-example value (eq. 7-8), written out here:
//   desirable:   w_d (1 - sigmoid(beta (log-ratio - z)))
//   undesirable: w_u (1 - sigmoid(beta (z - log-ratio)))
// on a mixed batch and on batches of one kind, with float64 finite-difference gradients; and
// B pairs give the paired loss when written as 2B unpaired rows.
TEST(PreferenceLoss, UnpairedKtoIsThePapersMeanOverRowsOfEitherKind) {
  const std::vector<double> pol = {-4.0, -2.5, -7.0, -5.0, -2.0, -6.5};
  const std::vector<double> ref = {-4.5, -2.0, -6.0, -4.0, -2.2, -6.0};
  const int64_t R = 6;
  PreferenceLoss l = all_losses().back();
  ASSERT_EQ(l.kind, PreferenceLossKind::KTO);
  l.unpaired = true;
  // The loss (and the rewards into *rewards); with check, the gradients against finite
  // differences (a graph whose only output is the loss).
  auto run = [&](const PreferenceLoss& loss, const std::vector<double>& mask, double scale,
                 std::vector<double>* rewards, bool check = false) {
    Graph g(DType::F64);
    Builder b(g);
    Value p = g.param("policy", {R}, true);
    Value r = g.input("ref", {R}, DType::F64);
    Value sc = g.input("scale", {}, DType::F64);
    Value kl = g.input("kl", {}, DType::F64);
    Value d = loss.unpaired ? g.input("desirable", {R}, DType::F64) : Value{};
    PreferenceLossOutputs out = build_preference_loss(b, loss, p, r, {}, sc, kl, d);
    g.mark_output("loss", out.loss);
    if (rewards) g.mark_output("rewards", out.rewards);
    TensorMap params{{"policy", Tensor::empty({R}, DType::F64)}};
    TensorMap in{{"ref", Tensor::empty({R}, DType::F64)},
                 {"desirable", Tensor::empty({R}, DType::F64)},
                 {"scale", scalar_tensor(scale, DType::F64)},
                 {"kl", scalar_tensor(kKtoKl, DType::F64)}};
    for (int64_t i = 0; i < R; ++i) {
      params["policy"].data<double>()[i] = pol[size_t(i)];
      in["ref"].data<double>()[i] = ref[size_t(i)];
      in["desirable"].data<double>()[i] = mask[size_t(i)];
    }
    const auto o = EagerExecutor(g).run(in, params);
    if (rewards)
      for (int64_t i = 0; i < R; ++i) rewards->push_back(o[1].data<double>()[i]);
    if (check) check_gradients(g, out.loss, params, in, 12, 1e-7);
    return o[0].data<double>()[0];
  };
  for (const std::vector<double>& mask :
       {std::vector<double>{1, 0, 0, 1, 0, 1}, std::vector<double>(6, 1.0),
        std::vector<double>(6, 0.0)}) {
    double expected = 0;
    for (int64_t i = 0; i < R; ++i) {
      const double lr = pol[size_t(i)] - ref[size_t(i)], z = kKtoKl;
      expected += mask[size_t(i)] != 0
                      ? l.desirable_weight * (1 - 1 / (1 + std::exp(-l.beta * (lr - z))))
                      : l.undesirable_weight * (1 - 1 / (1 + std::exp(-l.beta * (z - lr))));
    }
    expected /= double(R);
    std::vector<double> rewards;
    EXPECT_NEAR(run(l, mask, 1.0 / double(R), &rewards), expected, 1e-12);
    run(l, mask, 1.0 / double(R), nullptr, /*check=*/true);
    for (int64_t i = 0; i < R; ++i)
      EXPECT_NEAR(rewards[size_t(i)], l.beta * (pol[size_t(i)] - ref[size_t(i)]), 1e-12);
  }
  // 3 pairs (chosen rows, then rejected) = the same 6 rows unpaired, 3 desirable then 3 not.
  PreferenceLoss paired = l;
  paired.unpaired = false;
  EXPECT_NEAR(run(l, {1, 1, 1, 0, 0, 0}, 1.0 / double(R), nullptr),
              run(paired, {1, 1, 1, 0, 0, 0}, 1.0 / double(R / 2), nullptr), 1e-14);
}

// ---- the whole step: the three compile modes agree ----------------------------------------

// A preference batch of B pairs over the tiny model: rows 0..B-1 chosen, B..2B-1 rejected,
// the first `prompt` positions of each row are prompt (-100).
Batch pair_batch(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  Batch b = random_batch(2 * B, T, V, seed);
  for (int64_t r = 0; r < 2 * B; ++r)
    for (int64_t t = 0; t < T; ++t) {
      int32_t& y = b.labels[size_t(r * T + t)];
      if (t < 2)
        y = kIgnoreIndex;
      else if (y == kIgnoreIndex && t < T - 1)
        y = b.tokens[size_t(r * T + t + 1)];
    }
  return b;
}

TensorMap pair_inputs(const Batch& b, DType dt, const std::vector<double>& ref) {
  TensorMap in = batch_inputs(b, dt, 1.0 / double(b.batch_size / 2));
  const int64_t rows = b.batch_size, T = b.seq_len;
  Tensor mask = Tensor::empty({rows * T}, dt), inv = Tensor::empty({rows}, dt),
         r = Tensor::empty({rows}, dt);
  for (int64_t i = 0; i < rows; ++i) {
    int64_t n = 0;
    for (int64_t t = 0; t < T; ++t) n += b.labels[size_t(i * T + t)] != kIgnoreIndex;
    for (int64_t t = 0; t < T; ++t) {
      const double m = b.labels[size_t(i * T + t)] != kIgnoreIndex ? 1.0 : 0.0;
      if (dt == DType::F64)
        mask.data<double>()[i * T + t] = m;
      else
        mask.data<float>()[i * T + t] = float(m);
    }
    if (dt == DType::F64) {
      inv.data<double>()[i] = 1.0 / double(n);
      r.data<double>()[i] = ref[size_t(i)];
    } else {
      inv.data<float>()[i] = float(1.0 / double(n));
      r.data<float>()[i] = float(ref[size_t(i)]);
    }
  }
  in["response_mask"] = mask;
  in["inv_response_len"] = inv;
  in["ref_logps"] = r;
  in["kto_kl"] = scalar_tensor(kKtoKl, dt);  // read by KTO's graphs only
  return in;
}

TEST(PreferenceStep, CompileModesAgreeOnEveryLossAndNoLogitsExistWhenCompiled) {
  for (bool tied : {false, true})
    for (bool frozen_head : {false, true})
      for (const PreferenceLoss& l : all_losses()) {
        const ModelConfig cfg = tiny_config(tied, false);
        const int64_t B = 2, T = 8;
        TrainingGraphOptions o;
        o.batch_size = 2 * B;
        o.seq_len = T;
        o.loss = preference_loss_builder(l);
        if (frozen_head)  // as under LoRA: the head (or the tied table) gets no gradient
          o.trainable = [](const std::string& n) {
            return n != "lm_head.weight" && n != "model.embed_tokens.weight";
          };
        TrainingGraph tg = build_training_graph(cfg, o);
        TensorMap params = init_parameters(graph_parameters(tg.graph), 7, DType::F32, 0.3);
        const Batch b = pair_batch(B, T, cfg.vocab_size, 11);
        const TensorMap in = pair_inputs(b, DType::F32, {-20, -22, -21, -19});
        std::vector<std::vector<Tensor>> outs;
        for (CompileMode mode : {CompileMode::None, CompileMode::Model, CompileMode::Full}) {
          PassOptions po;
          po.mode = mode;
          outs.push_back(compile_graph(tg.graph, po).executor->run(in, params));
          if (mode == CompileMode::Full) {
            Graph run = run_passes(tg.graph, po, nullptr);
            EXPECT_EQ(count_ops(run, Op::FusedLinearLogProbs), 1) << l.name();
            EXPECT_EQ(count_ops(run, Op::FusedLinearLogProbsBackward), 1) << l.name();
            for (const Node& n : run.nodes())
              if (n.op == Op::FusedLinearLogProbsBackward) {
                EXPECT_EQ(n.attrs.no_weight_grad, frozen_head) << l.name();
              }
            // Beyond the one chunk's logits that a trained head keeps for its backward (every
            // row fits one chunk here), no [tokens x vocab] tensor.
            for (const Node& n : run.nodes())
              for (size_t k = 0; k < n.outputs.size(); ++k) {
                const TensorType& t = n.outputs[k];
                EXPECT_FALSE(!is_kept_head_logits(n, k) && t.shape.size() == 2 &&
                             t.shape[0] == 2 * B * T && t.shape[1] == cfg.vocab_size)
                    << op_name(n.op) << " materializes [tokens x vocab] under compile: true";
              }
          }
        }
        for (size_t m = 1; m < outs.size(); ++m)
          for (size_t k = 0; k < outs[0].size(); ++k) {
            const double tol = k == 0 ? 1e-5 : 1e-4;
            EXPECT_LT(max_rel_diff(outs[m][k], outs[0][k]), tol)
                << l.name() << " mode " << m << " output " << tg.graph.outputs()[k].first;
          }
      }
}

// Unpaired KTO's step graph: the three compile modes agree, with the head fused under true.
TEST(PreferenceStep, CompileModesAgreeOnUnpairedKto) {
  const ModelConfig cfg = tiny_config(false, false);
  const int64_t R = 4, T = 8;
  PreferenceLoss l = all_losses().back();
  l.unpaired = true;
  TrainingGraphOptions o;
  o.batch_size = R;
  o.seq_len = T;
  o.loss = preference_loss_builder(l);
  TrainingGraph tg = build_training_graph(cfg, o);
  TensorMap params = init_parameters(graph_parameters(tg.graph), 7, DType::F32, 0.3);
  TensorMap in =
      pair_inputs(pair_batch(R / 2, T, cfg.vocab_size, 11), DType::F32, {-20, -22, -21, -19});
  in["loss_scale"] = scalar_tensor(1.0 / double(R), DType::F32);
  Tensor desirable = Tensor::empty({R}, DType::F32);
  for (int64_t i = 0; i < R; ++i) desirable.data<float>()[i] = i == 1 ? 1.0f : 0.0f;
  in["desirable"] = desirable;
  std::vector<std::vector<Tensor>> outs;
  for (CompileMode mode : {CompileMode::None, CompileMode::Model, CompileMode::Full}) {
    PassOptions po;
    po.mode = mode;
    outs.push_back(compile_graph(tg.graph, po).executor->run(in, params));
    if (mode == CompileMode::Full) {
      EXPECT_EQ(count_ops(run_passes(tg.graph, po, nullptr), Op::FusedLinearLogProbsBackward), 1);
    }
  }
  for (size_t m = 1; m < outs.size(); ++m)
    for (size_t k = 0; k < outs[0].size(); ++k) {
      EXPECT_LT(max_rel_diff(outs[m][k], outs[0][k]), k == 0 ? 1e-5 : 1e-4)
          << "mode " << m << " output " << tg.graph.outputs()[k].first;
    }
}

// Gemma 2 under DPO: the soft-capped logits fold into the fused log-prob kernels (trainable
// tied head, and frozen as under LoRA: the E_p[W] route), every mode equal to eager in float64.
TEST(PreferenceStep, Gemma2SoftcappedLogitsFuseAndAgreeInEveryMode) {
  for (bool frozen_head : {false, true}) {
    const ModelConfig cfg = tiny_gemma2_config();
    const int64_t B = 2, T = 8;
    PreferenceLoss l;
    l.beta = 0.5;
    TrainingGraphOptions o;
    o.batch_size = 2 * B;
    o.seq_len = T;
    o.dtype = DType::F64;
    o.loss = preference_loss_builder(l);
    if (frozen_head)
      o.trainable = [](const std::string& n) { return n != "model.embed_tokens.weight"; };
    TrainingGraph tg = build_training_graph(cfg, o);
    TensorMap params = init_parameters(graph_parameters(tg.graph), 7, DType::F64, 0.3);
    const TensorMap in =
        pair_inputs(pair_batch(B, T, cfg.vocab_size, 11), DType::F64, {-20, -22, -21, -19});
    const auto ref = EagerExecutor(tg.graph).run(in, params);
    PassOptions po;
    Graph run = run_passes(tg.graph, po, nullptr);
    EXPECT_EQ(count_ops(run, Op::FusedLinearLogProbs), 1);
    EXPECT_EQ(count_ops(run, Op::FusedLinearLogProbsBackward), 1);
    EXPECT_EQ(count_ops(run, Op::Softcap), 0);
    const auto out = compile_graph(tg.graph, po).executor->run(in, params);
    ASSERT_EQ(out.size(), ref.size());
    for (size_t k = 0; k < out.size(); ++k)
      EXPECT_LT(max_rel_diff(out[k], ref[k]), 1e-10)
          << "frozen " << frozen_head << " " << tg.graph.outputs()[k].first;
  }
}

TEST(PreferenceStep, WholeStepGradientsMatchFiniteDifferencesInFloat64) {
  const ModelConfig cfg = tiny_config(true, false);
  const int64_t B = 1, T = 6;
  PreferenceLoss l;
  l.beta = 0.5;
  TrainingGraphOptions o;
  o.batch_size = 2 * B;
  o.seq_len = T;
  o.dtype = DType::F64;
  o.trainable = [](const std::string& n) { return n.find("embed") != std::string::npos; };
  Graph g(DType::F64);
  {
    // The forward alone: check_gradients appends the backward itself.
    Builder b(g);
    LlamaInputs li;
    li.tokens = g.input("tokens", {2 * B, T}, DType::I32);
    Value labels = g.input("labels", {2 * B, T}, DType::I32);
    li.positions = g.input("positions", {2 * B, T}, DType::I32);
    Value scale = g.input("loss_scale", {}, DType::F64);
    LossContext c;
    c.model = build_llama(b, cfg, li, o.trainable);
    c.labels = b.reshape(labels, {2 * B * T});
    c.scale = scale;
    c.batch_size = 2 * B;
    c.seq_len = T;
    LossOutputs lo = preference_loss_builder(l)(b, c);
    g.mark_output("loss", lo.loss);
    TensorMap params = init_parameters(graph_parameters(g), 3, DType::F64, 0.5);
    const Batch batch = pair_batch(B, T, cfg.vocab_size, 5);
    check_gradients(g, lo.loss, params, pair_inputs(batch, DType::F64, {-9, -8}), 10, 1e-6);
  }
}

TEST(PreferenceStep, ReferenceGraphFusesForwardOnlyAndMatchesEager) {
  const ModelConfig cfg = tiny_config(false, true);
  const int64_t rows = 4, T = 8;
  Graph g = build_sequence_log_probs_graph(cfg, rows, T, DType::F32);
  TensorMap params = init_parameters(graph_parameters(g), 9, DType::F32, 0.3);
  const TensorMap in = pair_inputs(pair_batch(2, T, cfg.vocab_size, 3), DType::F32, {0, 0, 0, 0});
  PassOptions eager, full;
  eager.mode = CompileMode::None;
  const auto a = compile_graph(g, eager).executor->run(in, params);
  const auto b = compile_graph(g, full).executor->run(in, params);
  EXPECT_EQ(count_ops(run_passes(g, full, nullptr), Op::FusedLinearLogProbs), 1);
  EXPECT_EQ(count_ops(run_passes(g, full, nullptr), Op::LogSoftmax), 0);
  for (size_t k = 0; k < a.size(); ++k) EXPECT_LT(max_rel_diff(b[k], a[k]), 1e-5);
}

}  // namespace
