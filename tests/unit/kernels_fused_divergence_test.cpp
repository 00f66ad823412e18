// The fused linear + divergence kernel (kernels/cpu/fused_linear_divergence.h) against the
// unfused path it replaces: both models' logits materialized, the CE from the definition and
// the divergence and its gradient from the Divergence op's kernels (divergence.h), over
// several chunks (the last one partial) with ignored rows, every divergence kind, a trained
// and a frozen student head. Its finite-difference check is the op table's
// (OpTable.EveryVjpMatchesFiniteDifferencesInFloat64, with a LoRA term on the head). An NF4
// student head and a LoRA term on it against the merged dense head.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "fusetune/core/dtype.h"
#include "fusetune/kernels/cpu/divergence.h"
#include "fusetune/kernels/cpu/fused_linear_divergence.h"
#include "fusetune/kernels/cpu/peft_ops.h"
#include "kernels_test_util.h"
#include "nf4_support.h"

using namespace fusetune;
using namespace fusetune::kernels;
using namespace fusetune::testing;

namespace {

struct KdProblem {
  int64_t N = 37, D = 8, Dt = 6, V = 50;
  std::vector<double> h = random_vec(N * D, 1), W = random_vec(V * D, 2, -0.8, 0.8);
  std::vector<double> th = random_vec(N * Dt, 3), tW = random_vec(V * Dt, 4, -1.2, 1.2);
  std::vector<int32_t> labels;
  KdProblem() {
    for (int64_t i = 0; i < N; ++i) labels.push_back(i % 5 == 2 ? -100 : int32_t((i * 7) % V));
  }
};

// The problem's inputs: its labels and sizes, h and th (null: no teacher head, as with a top-k
// teacher) in T, `dp`; each test sets the heads it varies.
template <class T>
LinearDivergenceInputs<T> problem_inputs(const KdProblem& p, const T* h, const T* th,
                                         const DivergenceParams& dp, int64_t chunk = 16) {
  LinearDivergenceInputs<T> in;
  in.h = h;
  in.D = p.D;
  in.teacher_h = th;
  in.teacher_D = th ? p.Dt : 0;
  in.labels = p.labels.data();
  in.N = p.N;
  in.V = p.V;
  in.chunk_rows = chunk;
  in.divergence = dp;
  return in;
}

// The unfused reference in double: z = h W^T for both models, then per row the CE from its
// definition and the divergence (with its gradient) from divergence.h's unfused kernels.
struct Reference {
  double ce = 0, kd = 0;
  std::vector<double> dh, dW;
};
Reference reference(const KdProblem& p, const DivergenceParams& dp, double dce, double dkd) {
  auto logits = [&](const std::vector<double>& h, const std::vector<double>& W, int64_t D) {
    std::vector<double> z(size_t(p.N * p.V), 0.0);
    for (int64_t i = 0; i < p.N; ++i)
      for (int64_t v = 0; v < p.V; ++v)
        for (int64_t d = 0; d < D; ++d) z[i * p.V + v] += h[i * D + d] * W[v * D + d];
    return z;
  };
  const std::vector<double> zs = logits(p.h, p.W, p.D), zt = logits(p.th, p.tW, p.Dt);
  Reference r;
  r.kd = divergence_sum<double>(zs.data(), zt.data(), p.labels.data(), p.N, p.V, dp);
  std::vector<double> dz(zs.size());
  divergence_backward<double>(dkd, zs.data(), zt.data(), p.labels.data(), dz.data(), p.N, p.V, dp);
  for (int64_t i = 0; i < p.N; ++i) {
    const int32_t y = p.labels[size_t(i)];
    if (y == -100) continue;
    double s = 0;
    for (int64_t v = 0; v < p.V; ++v) s += std::exp(zs[i * p.V + v]);
    r.ce += std::log(s) - zs[i * p.V + y];
    for (int64_t v = 0; v < p.V; ++v)
      dz[i * p.V + v] += dce * (std::exp(zs[i * p.V + v]) / s - (v == y ? 1.0 : 0.0));
  }
  r.dh.assign(size_t(p.N * p.D), 0.0);
  r.dW.assign(size_t(p.V * p.D), 0.0);
  for (int64_t i = 0; i < p.N; ++i)
    for (int64_t v = 0; v < p.V; ++v)
      for (int64_t d = 0; d < p.D; ++d) {
        r.dh[i * p.D + d] += dz[i * p.V + v] * p.W[v * p.D + d];
        r.dW[v * p.D + d] += dz[i * p.V + v] * p.h[i * p.D + d];
      }
  return r;
}

template <class T>
struct Fused {
  std::array<double, 2> sums{};
  std::vector<T> dh, dW;
};
template <class T>
Fused<T> run_fused(const KdProblem& p, const DivergenceParams& dp, double dce, double dkd,
                   int64_t chunk, bool grads, bool frozen_head) {
  const std::vector<T> h(p.h.begin(), p.h.end()), W(p.W.begin(), p.W.end());
  const std::vector<T> th(p.th.begin(), p.th.end()), tW(p.tW.begin(), p.tW.end());
  LinearDivergenceInputs<T> in = problem_inputs<T>(p, h.data(), th.data(), dp, chunk);
  in.W = W.data();
  in.teacher_W = tW.data();
  Fused<T> f;
  f.dh.assign(size_t(p.N * p.D), T(7));  // the kernel overwrites every element
  f.dW.assign(size_t(p.V * p.D), T(7));
  LinearDivergenceGrads<T> g{dce, dkd, f.dh.data(), frozen_head ? nullptr : f.dW.data()};
  f.sums = fused_linear_divergence<T>(in, grads ? &g : nullptr);
  return f;
}

const std::vector<DivergenceParams> kKinds = {{DivergenceKind::ForwardKL, 0.5, 1.0},
                                              {DivergenceKind::ReverseKL, 0.5, 2.0},
                                              {DivergenceKind::GeneralizedJSD, 0.3, 1.5}};

}  // namespace

// Double: the fused sweep equals the unfused path to rounding, whatever the chunking (7 and
// 16 rows: 6 and 3 chunks, the last partial; 64: one).
TEST(FusedDivergenceKernel, MatchesTheUnfusedDivergenceAndCrossEntropyInDouble) {
  const KdProblem p;
  for (const DivergenceParams& dp : kKinds) {
    const Reference r = reference(p, dp, 0.35, 0.65);
    for (int64_t chunk : {7, 16, 64}) {
      SCOPED_TRACE("kind " + std::to_string(int(dp.kind)) + " chunk " + std::to_string(chunk));
      const Fused<double> f = run_fused<double>(p, dp, 0.35, 0.65, chunk, true, false);
      EXPECT_NEAR(f.sums[0], r.ce, 1e-10 * std::abs(r.ce));
      EXPECT_NEAR(f.sums[1], r.kd, 1e-10 * std::abs(r.kd) + 1e-12);
      expect_close(f.dh, r.dh, 1e-9, 1e-12, "dh");
      expect_close(f.dW, r.dW, 1e-9, 1e-12, "dW");
    }
  }
}

// Float: sums within 1e-5 relative, gradients within 1e-4 relative + 1e-6 absolute (the
// logits are rounded to float before the double-precision softmax and divergence).
TEST(FusedDivergenceKernel, MatchesTheUnfusedPathInFloatWithinStatedTolerance) {
  const KdProblem p;
  for (const DivergenceParams& dp : kKinds) {
    SCOPED_TRACE("kind " + std::to_string(int(dp.kind)));
    const Reference r = reference(p, dp, 0.5, 0.5);
    const Fused<float> f = run_fused<float>(p, dp, 0.5, 0.5, 16, true, false);
    EXPECT_NEAR(f.sums[0], r.ce, 1e-5 * std::abs(r.ce));
    EXPECT_NEAR(f.sums[1], r.kd, 1e-5 * std::abs(r.kd) + 1e-6);
    expect_close(f.dh, r.dh, 1e-4, 1e-6, "dh");
    expect_close(f.dW, r.dW, 1e-4, 1e-6, "dW");
  }
}

// A frozen student head (LoRA) gets no dW and the same dh; forward only gives the same sums;
// ignored rows get a zero gradient.
TEST(FusedDivergenceKernel, FrozenHeadAndForwardOnly) {
  const KdProblem p;
  const DivergenceParams dp = kKinds[2];
  const Fused<double> full = run_fused<double>(p, dp, 0.2, 0.8, 16, true, false);
  const Fused<double> frozen = run_fused<double>(p, dp, 0.2, 0.8, 16, true, true);
  const Fused<double> fwd = run_fused<double>(p, dp, 0.2, 0.8, 16, false, false);
  EXPECT_TRUE(bitwise_equal(frozen.dh, full.dh));
  EXPECT_EQ(frozen.dW, std::vector<double>(size_t(p.V * p.D), 7.0)) << "dW was written";
  EXPECT_EQ(fwd.sums, full.sums);
  for (int64_t i = 0; i < p.N; ++i)
    if (p.labels[size_t(i)] == -100) {
      for (int64_t d = 0; d < p.D; ++d) EXPECT_EQ(full.dh[size_t(i * p.D + d)], 0.0);
    }
}

// bf16 heads (a `dtype: bf16` run), the student's, the teacher's or both, widened a tile at a
// time inside the chunk's GEMMs: the dense float path on the same widened weights, to float
// rounding (the tiles change only how the head's products are blocked).
TEST(FusedDivergenceKernel, Bf16HeadsMatchTheDensePathOnTheirWidenedValues) {
  const KdProblem p;
  const DivergenceParams dp = kKinds[2];
  const auto bf16 = [](const std::vector<double>& x) {
    std::vector<uint16_t> b;
    for (double v : x) b.push_back(f32_to_bf16(float(v)));
    return b;
  };
  const auto widened = [](const std::vector<uint16_t>& b) {
    std::vector<float> f;
    for (uint16_t v : b) f.push_back(bf16_to_f32(v));
    return f;
  };
  const std::vector<uint16_t> W16 = bf16(p.W), tW16 = bf16(p.tW);
  const std::vector<float> W = widened(W16), tW = widened(tW16);
  const std::vector<float> h(p.h.begin(), p.h.end()), th(p.th.begin(), p.th.end());
  const auto run = [&](bool student_bf16, bool teacher_bf16) {
    LinearDivergenceInputs<float> in = problem_inputs<float>(p, h.data(), th.data(), dp);
    if (student_bf16)
      in.W_bf16 = W16.data();
    else
      in.W = W.data();
    if (teacher_bf16)
      in.teacher_W_bf16 = tW16.data();
    else
      in.teacher_W = tW.data();
    Fused<float> f;
    f.dh.assign(size_t(p.N * p.D), 7.f);
    f.dW.assign(size_t(p.V * p.D), 7.f);
    LinearDivergenceGrads<float> g{0.3, 0.7, f.dh.data(), f.dW.data()};
    f.sums = fused_linear_divergence<float>(in, &g);
    return f;
  };
  const Fused<float> dense = run(false, false);
  for (auto [s, t] : {std::pair{true, false}, {false, true}, {true, true}}) {
    SCOPED_TRACE("student bf16 " + std::to_string(s) + " teacher bf16 " + std::to_string(t));
    const Fused<float> f = run(s, t);
    EXPECT_NEAR(f.sums[0], dense.sums[0], 1e-6 * std::abs(dense.sums[0]));
    EXPECT_NEAR(f.sums[1], dense.sums[1], 1e-6 * std::abs(dense.sums[1]) + 1e-7);
    expect_close(f.dh, dense.dh, 1e-5, 1e-7, "dh");
    expect_close(f.dW, dense.dW, 1e-5, 1e-7, "dW");
  }
}

// The student's head as the LoRA and QLoRA students have it: a base W (dense, or NF4
// dequantized a tile at a time) plus a rank-3 LoRA term (A [r, D], Bs = scale * B [V, r]).
// The logits are h (W + Bs A)^T, so the reference is the unfused path on the merged dense head
// W + Bs A, and by the chain rule dA = Bs^T dW_merged, dBs = dW_merged A^T, computed here from
// the reference's dW_merged. Double, 3 chunks (the last partial); forward only gives the same
// sums.
TEST(FusedDivergenceKernel, LoraTermAndNf4HeadMatchTheMergedDenseHeadInDouble) {
  KdProblem p;
  const int64_t r = 3;
  const std::vector<double> A = random_vec(r * p.D, 8, -0.7, 0.7);
  const std::vector<double> Bs = random_vec(p.V * r, 9, -0.5, 0.5);
  const NF4Weight q = quantize_nf4(p.W, p.V, p.D);
  const NF4View view = q.view();
  const DivergenceParams dp = kKinds[2];
  for (bool nf4 : {false, true})
    for (bool lora : {false, true}) {
      if (!nf4 && !lora) continue;  // the dense head: the tests above
      SCOPED_TRACE("nf4 " + std::to_string(nf4) + " lora " + std::to_string(lora));
      const std::vector<double> base = nf4 ? q.dequantized() : p.W;
      KdProblem merged = p;
      merged.W = base;
      if (lora)
        for (int64_t v = 0; v < p.V; ++v)
          for (int64_t d = 0; d < p.D; ++d)
            for (int64_t k = 0; k < r; ++k) merged.W[v * p.D + d] += Bs[v * r + k] * A[k * p.D + d];
      const Reference ref = reference(merged, dp, 0.4, 0.6);
      LinearDivergenceInputs<double> in = problem_inputs<double>(p, p.h.data(), p.th.data(), dp);
      in.teacher_W = p.tW.data();
      if (nf4)
        in.W_nf4 = &view;
      else
        in.W = p.W.data();
      if (lora) {
        in.lora_A = A.data();
        in.lora_B = Bs.data();
        in.lora_rank = r;
      }
      std::vector<double> dh(size_t(p.N * p.D), 7), dW(size_t(p.V * p.D), 7);
      std::vector<double> dA(size_t(r * p.D), 7), dB(size_t(p.V * r), 7);
      LinearDivergenceGrads<double> g{0.4,
                                      0.6,
                                      dh.data(),
                                      nf4 ? nullptr : dW.data(),
                                      lora ? dA.data() : nullptr,
                                      lora ? dB.data() : nullptr};
      const std::array<double, 2> sums = fused_linear_divergence<double>(in, &g);
      EXPECT_NEAR(sums[0], ref.ce, 1e-10 * std::abs(ref.ce));
      EXPECT_NEAR(sums[1], ref.kd, 1e-10 * std::abs(ref.kd) + 1e-12);
      EXPECT_EQ(fused_linear_divergence<double>(in, nullptr), sums);
      expect_close(dh, ref.dh, 1e-9, 1e-12, "dh");
      // The trained dense base's gradient is the merged head's (the LoRA term is linear in W).
      if (!nf4) expect_close(dW, ref.dW, 1e-9, 1e-12, "dW");
      if (!lora) continue;
      std::vector<double> want_dA(size_t(r * p.D), 0.0), want_dB(size_t(p.V * r), 0.0);
      for (int64_t v = 0; v < p.V; ++v)
        for (int64_t d = 0; d < p.D; ++d)
          for (int64_t k = 0; k < r; ++k) {
            want_dA[k * p.D + d] += Bs[v * r + k] * ref.dW[v * p.D + d];
            want_dB[v * r + k] += ref.dW[v * p.D + d] * A[k * p.D + d];
          }
      expect_close(dA, want_dA, 1e-9, 1e-12, "dA");
      expect_close(dB, want_dB, 1e-9, 1e-12, "dB");
    }
}

// The teacher as its top-k (precomputed teacher logits): teacher_top_k keeps each row's k
// largest logits in order with their log-probs, and the fused sweep over them gives the
// forward KL to the teacher restricted to its top-k and renormalized, written out here in
// double from its definition: p~_i = exp(lp_i / T) / sum_{j in top-k} exp(lp_j / T),
// KD = -sum_i p~_i log q(id_i), q = softmax(zs / T); its gradient dkd (q - p~) / T on top of
// the CE's. With k = V it is the exact forward KL of the dense teacher.
TEST(FusedDivergenceKernel, TopKTeacherMatchesTheRestrictedForwardKlInDouble) {
  const KdProblem p;
  const double T = 1.7, dce = 0.3, dkd = 0.7;
  const DivergenceParams dp{DivergenceKind::ForwardKL, 0.5, T};
  for (int64_t K : {int64_t(1), int64_t(6), p.V}) {
    SCOPED_TRACE("k " + std::to_string(K));
    std::vector<int32_t> ids(size_t(p.N * K));
    std::vector<double> lp(size_t(p.N * K));
    teacher_top_k<double>(p.th.data(), p.tW.data(), nullptr, p.N, p.Dt, p.V, K, 16, ids.data(),
                          lp.data());
    double ce = 0, kd = 0;
    std::vector<double> dz(size_t(p.N * p.V), 0.0);
    for (int64_t i = 0; i < p.N; ++i) {
      // The teacher's logits and their log-softmax; the top-k by sorting.
      std::vector<double> zt(size_t(p.V), 0.0), zs(size_t(p.V), 0.0);
      for (int64_t v = 0; v < p.V; ++v)
        for (int64_t d = 0; d < p.Dt; ++d) zt[v] += p.th[i * p.Dt + d] * p.tW[v * p.Dt + d];
      for (int64_t v = 0; v < p.V; ++v)
        for (int64_t d = 0; d < p.D; ++d) zs[v] += p.h[i * p.D + d] * p.W[v * p.D + d];
      std::vector<int32_t> order(size_t(p.V));
      for (int64_t v = 0; v < p.V; ++v) order[v] = int32_t(v);
      std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return zt[a] > zt[b]; });
      double st = 0;
      for (double z : zt) st += std::exp(z);
      for (int64_t k = 0; k < K; ++k) {
        EXPECT_EQ(ids[i * K + k], order[k]);
        EXPECT_NEAR(lp[i * K + k], zt[order[k]] - std::log(st), 1e-12);
      }
      const int32_t y = p.labels[size_t(i)];
      if (y == -100) continue;
      double ss = 0, sT = 0, pk = 0;
      for (double z : zs) ss += std::exp(z), sT += std::exp(z / T);
      for (int64_t k = 0; k < K; ++k) pk += std::exp(lp[i * K + k] / T);
      ce += std::log(ss) - zs[y];
      for (int64_t v = 0; v < p.V; ++v)
        dz[i * p.V + v] =
            dce * (std::exp(zs[v]) / ss - (v == y)) + dkd / T * std::exp(zs[v] / T) / sT;
      for (int64_t k = 0; k < K; ++k) {
        const double pt = std::exp(lp[i * K + k] / T) / pk;
        const int32_t v = ids[i * K + k];
        kd -= pt * (zs[v] / T - std::log(sT));
        dz[i * p.V + v] -= dkd / T * pt;
      }
    }
    std::vector<double> want_dh(size_t(p.N * p.D), 0.0), want_dW(size_t(p.V * p.D), 0.0);
    for (int64_t i = 0; i < p.N; ++i)
      for (int64_t v = 0; v < p.V; ++v)
        for (int64_t d = 0; d < p.D; ++d) {
          want_dh[i * p.D + d] += dz[i * p.V + v] * p.W[v * p.D + d];
          want_dW[v * p.D + d] += dz[i * p.V + v] * p.h[i * p.D + d];
        }
    LinearDivergenceInputs<double> in = problem_inputs<double>(p, p.h.data(), nullptr, dp);
    in.W = p.W.data();
    in.teacher_topk_ids = ids.data();
    in.teacher_topk_logprobs = lp.data();
    in.teacher_top_k = K;
    std::vector<double> dh(size_t(p.N * p.D), 7), dW(size_t(p.V * p.D), 7);
    LinearDivergenceGrads<double> g{dce, dkd, dh.data(), dW.data()};
    const std::array<double, 2> sums = fused_linear_divergence<double>(in, &g);
    EXPECT_NEAR(sums[0], ce, 1e-10 * std::abs(ce));
    EXPECT_NEAR(sums[1], kd, 1e-10 * std::abs(kd));
    expect_close(dh, want_dh, 1e-9, 1e-12, "dh");
    expect_close(dW, want_dW, 1e-9, 1e-12, "dW");
    if (K != p.V) continue;
    // k = V: the dense teacher's exact forward KL (the unfused reference).
    const Reference r = reference(p, dp, dce, dkd);
    EXPECT_NEAR(sums[1], r.kd, 1e-10 * std::abs(r.kd));
    expect_close(dh, r.dh, 1e-9, 1e-12, "dh vs dense");
  }
}

// The teacher's top-k from a bf16 head (a `dtype: bf16` teacher) widened a tile at a time: the
// dense float path on the widened head's values (the same ids, log-probs to float rounding).
TEST(FusedDivergenceKernel, TopKOfABf16TeacherHeadIsTheDenseOneOfItsWidenedValues) {
  const KdProblem p;
  const int64_t K = 7;
  std::vector<uint16_t> W16;
  std::vector<float> W;
  for (double v : p.tW) {
    W16.push_back(f32_to_bf16(float(v)));
    W.push_back(bf16_to_f32(W16.back()));
  }
  const std::vector<float> h(p.th.begin(), p.th.end());
  std::vector<int32_t> ids_dense(size_t(p.N * K)), ids_bf16(size_t(p.N * K));
  std::vector<float> lp_dense(size_t(p.N * K)), lp_bf16(size_t(p.N * K));
  teacher_top_k<float>(h.data(), W.data(), nullptr, p.N, p.Dt, p.V, K, 16, ids_dense.data(),
                       lp_dense.data());
  teacher_top_k<float>(h.data(), nullptr, W16.data(), p.N, p.Dt, p.V, K, 16, ids_bf16.data(),
                       lp_bf16.data());
  EXPECT_EQ(ids_bf16, ids_dense);
  expect_close(lp_bf16, lp_dense, 1e-6, 1e-6, "log-probs");
}

// A teacher that soft-caps its logits (Gemma 2's final_logit_softcapping = c): its top-k are
// the ids of its largest uncapped logits (tanh is increasing) and their log-probs those of the
// capped distribution, log softmax(c tanh(z / c)), written out here in double; in double to
// 1e-12 and in float to float rounding (the same ids).
TEST(FusedDivergenceKernel, TopKOfASoftCappedTeacherHasTheCappedDistributionsLogProbs) {
  const KdProblem p;
  const int64_t K = 6;
  const double cap = 1.5;  // well inside the logits' range: capping changes every log-prob
  std::vector<int32_t> ids(size_t(p.N * K)), ids32(size_t(p.N * K));
  std::vector<double> lp(size_t(p.N * K));
  std::vector<float> lp32(size_t(p.N * K));
  teacher_top_k<double>(p.th.data(), p.tW.data(), nullptr, p.N, p.Dt, p.V, K, 16, ids.data(),
                        lp.data(), cap);
  const std::vector<float> h(p.th.begin(), p.th.end()), W(p.tW.begin(), p.tW.end());
  teacher_top_k<float>(h.data(), W.data(), nullptr, p.N, p.Dt, p.V, K, 16, ids32.data(),
                       lp32.data(), cap);
  double largest_change = 0;  // from the uncapped log-probs
  for (int64_t i = 0; i < p.N; ++i) {
    std::vector<double> z(size_t(p.V), 0.0);
    for (int64_t v = 0; v < p.V; ++v)
      for (int64_t d = 0; d < p.Dt; ++d) z[v] += p.th[i * p.Dt + d] * p.tW[v * p.Dt + d];
    std::vector<int32_t> order(size_t(p.V));
    for (int64_t v = 0; v < p.V; ++v) order[v] = int32_t(v);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return z[a] > z[b]; });
    double capped_sum = 0, plain_sum = 0;
    for (double zv : z)
      capped_sum += std::exp(cap * std::tanh(zv / cap)), plain_sum += std::exp(zv);
    for (int64_t k = 0; k < K; ++k) {
      const double want = cap * std::tanh(z[order[k]] / cap) - std::log(capped_sum);
      EXPECT_EQ(ids[i * K + k], order[k]);
      EXPECT_EQ(ids32[i * K + k], order[k]);
      EXPECT_NEAR(lp[i * K + k], want, 1e-12);
      EXPECT_NEAR(lp32[i * K + k], want, 2e-6);
      largest_change =
          std::max(largest_change, std::abs(want - (z[order[k]] - std::log(plain_sum))));
    }
  }
  EXPECT_GT(largest_change, 0.1);  // the cap matters here
}

// lora_dropout and DoRA on the student's head: the LoRA term reads its own input x (the
// dropped-out h) and DoRA scales each vocabulary column by c. Against the definition written
// out here in double: zs = (h W^T + (x A^T) Bs^T) diag(c), the CE and the divergence of those
// logits (divergence.h's unfused rows), and the chain rule through them:
// dz' = dz diag(c), dc = sum_rows dz * (h W^T + (x A^T) Bs^T), dh = dz' W, dW = dz'^T h,
// dx = (dz' Bs) A, dA = (dz' Bs)^T x, dBs = dz'^T (x A^T). 3 chunks (the last partial); each
// of x and c alone and both.
TEST(FusedDivergenceKernel, DropoutInputAndDoraScaleMatchTheirDefinitionInDouble) {
  const KdProblem p;
  const int64_t r = 3, N = p.N, V = p.V, D = p.D;
  const std::vector<double> A = random_vec(r * D, 8, -0.7, 0.7);
  const std::vector<double> Bs = random_vec(V * r, 9, -0.5, 0.5);
  const std::vector<double> x = random_vec(N * D, 10, -2, 2);
  const std::vector<double> col = random_vec(V, 11, 0.3, 1.7);
  const DivergenceParams dp = kKinds[2];
  const double dce = 0.4, dkd = 0.6;
  for (const auto& [own_x, dora] : {std::pair{true, false}, {false, true}, {true, true}}) {
    SCOPED_TRACE("own x " + std::to_string(own_x) + " dora " + std::to_string(dora));
    const std::vector<double>& xin = own_x ? x : p.h;
    // The pre-scale logits, the scaled ones and the teacher's.
    std::vector<double> pre(size_t(N * V), 0.0), u(size_t(N * r), 0.0), zt(size_t(N * V), 0.0);
    for (int64_t i = 0; i < N; ++i) {
      for (int64_t k = 0; k < r; ++k)
        for (int64_t d = 0; d < D; ++d) u[i * r + k] += xin[i * D + d] * A[k * D + d];
      for (int64_t v = 0; v < V; ++v) {
        for (int64_t d = 0; d < D; ++d) pre[i * V + v] += p.h[i * D + d] * p.W[v * D + d];
        for (int64_t k = 0; k < r; ++k) pre[i * V + v] += u[i * r + k] * Bs[v * r + k];
        for (int64_t d = 0; d < p.Dt; ++d) zt[i * V + v] += p.th[i * p.Dt + d] * p.tW[v * p.Dt + d];
      }
    }
    std::vector<double> zs = pre;
    if (dora)
      for (int64_t i = 0; i < N; ++i)
        for (int64_t v = 0; v < V; ++v) zs[i * V + v] *= col[v];
    const double kd = divergence_sum<double>(zs.data(), zt.data(), p.labels.data(), N, V, dp);
    std::vector<double> dz(zs.size());
    divergence_backward<double>(dkd, zs.data(), zt.data(), p.labels.data(), dz.data(), N, V, dp);
    double ce = 0;
    for (int64_t i = 0; i < N; ++i) {
      const int32_t y = p.labels[size_t(i)];
      if (y == -100) continue;
      double s = 0;
      for (int64_t v = 0; v < V; ++v) s += std::exp(zs[i * V + v]);
      ce += std::log(s) - zs[i * V + y];
      for (int64_t v = 0; v < V; ++v)
        dz[i * V + v] += dce * (std::exp(zs[i * V + v]) / s - (v == y ? 1.0 : 0.0));
    }
    std::vector<double> want_dc(size_t(V), 0.0);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t v = 0; v < V; ++v) {
        want_dc[v] += dz[i * V + v] * pre[i * V + v];
        if (dora) dz[i * V + v] *= col[v];
      }
    std::vector<double> want_dh(size_t(N * D), 0.0), want_dW(size_t(V * D), 0.0);
    std::vector<double> want_dx(size_t(N * D), 0.0), want_dA(size_t(r * D), 0.0);
    std::vector<double> want_dB(size_t(V * r), 0.0), w(size_t(N * r), 0.0);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t v = 0; v < V; ++v) {
        for (int64_t d = 0; d < D; ++d) {
          want_dh[i * D + d] += dz[i * V + v] * p.W[v * D + d];
          want_dW[v * D + d] += dz[i * V + v] * p.h[i * D + d];
        }
        for (int64_t k = 0; k < r; ++k) {
          w[i * r + k] += dz[i * V + v] * Bs[v * r + k];
          want_dB[v * r + k] += dz[i * V + v] * u[i * r + k];
        }
      }
    for (int64_t i = 0; i < N; ++i)
      for (int64_t k = 0; k < r; ++k)
        for (int64_t d = 0; d < D; ++d) {
          (own_x ? want_dx : want_dh)[i * D + d] += w[i * r + k] * A[k * D + d];
          want_dA[k * D + d] += w[i * r + k] * xin[i * D + d];
        }
    LinearDivergenceInputs<double> in = problem_inputs<double>(p, p.h.data(), p.th.data(), dp);
    in.W = p.W.data();
    in.teacher_W = p.tW.data();
    in.lora_A = A.data();
    in.lora_B = Bs.data();
    in.lora_rank = r;
    in.lora_x = own_x ? x.data() : nullptr;
    in.col_scale = dora ? col.data() : nullptr;
    std::vector<double> dh(size_t(N * D), 7), dW(size_t(V * D), 7), dA(size_t(r * D), 7);
    std::vector<double> dB(size_t(V * r), 7), dx(size_t(N * D), 7), dc(size_t(V), 7);
    LinearDivergenceGrads<double> g{dce,
                                    dkd,
                                    dh.data(),
                                    dW.data(),
                                    dA.data(),
                                    dB.data(),
                                    own_x ? dx.data() : nullptr,
                                    dora ? dc.data() : nullptr};
    const std::array<double, 2> sums = fused_linear_divergence<double>(in, &g);
    EXPECT_NEAR(sums[0], ce, 1e-10 * std::abs(ce));
    EXPECT_NEAR(sums[1], kd, 1e-10 * std::abs(kd) + 1e-12);
    EXPECT_EQ(fused_linear_divergence<double>(in, nullptr), sums);
    expect_close(dh, want_dh, 1e-9, 1e-12, "dh");
    expect_close(dW, want_dW, 1e-9, 1e-12, "dW");
    expect_close(dA, want_dA, 1e-9, 1e-12, "dA");
    expect_close(dB, want_dB, 1e-9, 1e-12, "dB");
    if (own_x) expect_close(dx, want_dx, 1e-9, 1e-12, "dx");
    if (dora) expect_close(dc, want_dc, 1e-9, 1e-12, "dc");
  }
}

// DoRA's row norms of the merged head W + Bs A without forming it (RowInvNorm with a low-rank
// term, the fused head's): a tile of 256 merged rows at a time, over 600 rows (a partial last
// tile), against 1 / ||row|| of the merged matrix written out here, in double to 1e-13.
TEST(FusedDivergenceKernel, DoraRowNormsOfTheMergedHeadTileByTile) {
  const int64_t V = 600, D = 9, r = 3;
  const std::vector<double> W = random_vec(V * D, 21, -1, 1), A = random_vec(r * D, 22, -1, 1);
  const std::vector<double> Bs = random_vec(V * r, 23, -0.5, 0.5);
  std::vector<double> got(size_t(V), 0.0);
  row_inv_norm_low_rank<double>(W.data(), A.data(), Bs.data(), got.data(), V, D, r);
  for (int64_t v = 0; v < V; ++v) {
    double s = 0;
    for (int64_t d = 0; d < D; ++d) {
      double m = W[v * D + d];
      for (int64_t k = 0; k < r; ++k) m += Bs[v * r + k] * A[k * D + d];
      s += m * m;
    }
    EXPECT_NEAR(got[size_t(v)], 1 / std::sqrt(s), 1e-13 / std::sqrt(s)) << "row " << v;
  }
}
