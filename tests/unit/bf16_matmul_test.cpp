// bf16 matmuls on the CPU's bf16 dot products (oneDNN, kernels/cpu/bf16_matmul.h) against an
// fp64 reference and against the widening path, in every transpose form, through the kernel
// and through a bf16 graph's MatMul node; FUSETUNE_BF16_MATMUL chooses and is validated; and
// one OpenMP runtime serves our code, OpenBLAS and oneDNN.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "fusetune/compile/memory_plan.h"
#include "fusetune/core/dtype.h"
#include "fusetune/kernels/cpu/bf16.h"
#include "fusetune/kernels/cpu/bf16_matmul.h"
#include "fusetune/kernels/cpu/fake_quant.h"
#include "fusetune/kernels/cpu/fused_linear_cross_entropy.h"
#include "fusetune/kernels/cpu/fused_linear_log_probs.h"
#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/kernels/cpu/nf4.h"
#include "fusetune/kernels/cpu/nf4_bf16_matmul.h"
#include "fusetune/runtime/eager_executor.h"
#include "fusetune/runtime/plan_executor.h"
#include "fusetune/util/error.h"

using namespace fusetune;

namespace {

constexpr const char* kEnv = "FUSETUNE_BF16_MATMUL";

// Sets FUSETUNE_BF16_MATMUL for one scope, then restores what was there.
class ScopedPath {
 public:
  explicit ScopedPath(const char* value) {
    if (const char* old = std::getenv(kEnv)) old_ = old;
    setenv(kEnv, value, 1);
  }
  ~ScopedPath() {
    if (old_) {
      setenv(kEnv, old_->c_str(), 1);
    } else {
      unsetenv(kEnv);
    }
  }

 private:
  std::optional<std::string> old_;
};

std::vector<uint16_t> random_bf16(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(-2.0f, 2.0f);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (uint16_t& x : v) x = f32_to_bf16(d(rng));
  return v;
}

struct Case {
  bool ta, tb;
  int64_t M, N, K;
};

std::string name(const Case& c) {
  return std::string(c.ta ? "A^T" : "A") + (c.tb ? " B^T" : " B") + " M=" + std::to_string(c.M) +
         " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K);
}

// Every transpose form; odd sizes, K not a multiple of any block (oneDNN's bf16 kernels pair
// k's and block K by 32 or more), one row (decode), one term.
std::vector<Case> cases() {
  const std::vector<std::vector<int64_t>> sizes = {
      {1, 1, 1}, {3, 5, 1}, {5, 7, 3}, {1, 300, 129}, {17, 33, 29}, {31, 65, 130}, {64, 48, 1001}};
  std::vector<Case> out;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (const auto& s : sizes) out.push_back({ta, tb, s[0], s[1], s[2]});
  return out;
}

// A stored [M, K] ([K, M] if ta), B [K, N] ([N, K] if tb).
double a_at(const Case& c, const std::vector<uint16_t>& A, int64_t i, int64_t k) {
  return bf16_to_f32(A[size_t(c.ta ? k * c.M + i : i * c.K + k)]);
}
double b_at(const Case& c, const std::vector<uint16_t>& B, int64_t k, int64_t j) {
  return bf16_to_f32(B[size_t(c.tb ? j * c.K + k : k * c.N + j)]);
}

// The exact product in fp64 (a bf16 product has 16 significant bits: exact) and, per element,
// sum_k |a_ik b_kj|, the scale of the rounding error.
struct Reference {
  std::vector<double> value, abs_sum;
};

Reference reference(const Case& c, const std::vector<uint16_t>& A, const std::vector<uint16_t>& B) {
  Reference r{std::vector<double>(size_t(c.M * c.N)), std::vector<double>(size_t(c.M * c.N))};
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < c.N; ++j) {
      double s = 0, a = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        const double p = a_at(c, A, i, k) * b_at(c, B, k, j);
        s += p;
        a += std::abs(p);
      }
      r.value[size_t(i * c.N + j)] = s;
      r.abs_sum[size_t(i * c.N + j)] = a;
    }
  return r;
}

// The tolerances, written out. u = 2^-24 is fp32's unit roundoff: K products summed in fp32 in
// any order are within K u sum|a b| of the exact sum (the classical bound, gamma_K ~ K u).
// A bf16 output is that sum rounded once more to nearest even: bf16 keeps 8 significant bits,
// so its spacing at x is at most 2^-7 |x| and rounding moves x by at most 2^-8 |x|.
constexpr double kU32 = 0x1p-24, kHalfUlpBf16 = 0x1p-8;
double fp32_sum_tolerance(int64_t K, double abs_sum) { return double(K) * kU32 * abs_sum; }
double bf16_out_tolerance(int64_t K, double abs_sum, double value) {
  const double e = fp32_sum_tolerance(K, abs_sum);
  return e * (1 + kHalfUlpBf16) + kHalfUlpBf16 * std::abs(value);
}

// The widening path's product: both operands widened, fp32 OpenBLAS.
std::vector<float> widened_product(const Case& c, const std::vector<uint16_t>& A,
                                   const std::vector<uint16_t>& B) {
  std::vector<float> a(A.size()), b(B.size()), C(size_t(c.M * c.N));
  kernels::bf16_to_f32_array(A.data(), a.data(), int64_t(A.size()));
  kernels::bf16_to_f32_array(B.data(), b.data(), int64_t(B.size()));
  kernels::gemm<float>(c.ta, c.tb, c.M, c.N, c.K, 1.0f, a.data(), c.ta ? c.M : c.K, b.data(),
                       c.tb ? c.K : c.N, 0.0f, C.data(), c.N);
  return C;
}

// Row n's logits z [V] in fp64 under a head whose multiplied values are w(v, d); returns their
// log-sum-exp.
template <class W>
double row_logits(const std::vector<float>& h, int64_t n, int64_t D, int64_t V, const W& w,
                  std::vector<double>& z) {
  double mx = -INFINITY, sum = 0;
  z.assign(static_cast<size_t>(V), 0.0);
  for (int64_t v = 0; v < V; ++v) {
    for (int64_t d = 0; d < D; ++d) z[size_t(v)] += double(h[size_t(n * D + d)]) * w(v, d);
    mx = std::max(mx, z[size_t(v)]);
  }
  for (int64_t v = 0; v < V; ++v) sum += std::exp(z[size_t(v)] - mx);
  return mx + std::log(sum);
}

// A [rows, cols] weight of N(0, sd) values quantized to NF4 (QLoRA's base), and its dequantized
// fp32 values.
struct Nf4Weight {
  int64_t rows, cols;
  std::vector<int32_t> codes, absmax;
  std::vector<float> scales;
  float offset = 0;
  Nf4Weight(int64_t r, int64_t c, uint64_t seed, float sd) : rows(r), cols(c) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, sd);
    std::vector<float> w(static_cast<size_t>(r * c));
    for (float& v : w) v = nd(rng);
    const kernels::NF4Sizes sz = kernels::nf4_sizes(r * c);
    codes.resize(size_t(sz.code_words));
    absmax.resize(size_t(sz.absmax_words));
    scales.resize(size_t(sz.scales));
    kernels::nf4_quantize(w.data(), r * c, codes.data(), absmax.data(), scales.data(), &offset);
  }
  kernels::NF4View view() const {
    return {codes.data(), absmax.data(), scales.data(), offset, rows, cols};
  }
  std::vector<float> dequantized() const {
    std::vector<float> out(static_cast<size_t>(rows * cols));
    kernels::nf4_dequantize_rows(view(), 0, rows, out.data());
    return out;
  }
};

#define SKIP_WITHOUT_BF16_DOT_PRODUCTS()                                                 \
  if (!kernels::cpu_has_bf16_dot_products())                                             \
  GTEST_SKIP() << "this CPU has no bf16 dot products: oneDNN is never chosen here (the " \
                  "widening path's tests cover it)"

}  // namespace

TEST(Bf16Matmul, OneDnnMatchesTheFp64ReferenceInEveryTransposeForm) {
  SKIP_WITHOUT_BF16_DOT_PRODUCTS();
  uint64_t seed = 1;
  for (const Case& c : cases()) {
    const std::vector<uint16_t> A = random_bf16(c.M * c.K, seed++),
                                B = random_bf16(c.K * c.N, seed++);
    const Reference ref = reference(c, A, B);
    std::vector<float> C32(size_t(c.M * c.N), NAN);
    std::vector<uint16_t> C16(size_t(c.M * c.N), 0xFFFF);  // NaN: every element must be written
    kernels::matmul_bf16_onednn(c.ta, c.tb, c.M, c.N, c.K, A.data(), B.data(), C32.data(), false);
    kernels::matmul_bf16_onednn(c.ta, c.tb, c.M, c.N, c.K, A.data(), B.data(), C16.data(), true);
    for (size_t i = 0; i < C32.size(); ++i) {
      ASSERT_NEAR(C32[i], ref.value[i], fp32_sum_tolerance(c.K, ref.abs_sum[i]))
          << name(c) << " fp32 out, element " << i;
      ASSERT_NEAR(bf16_to_f32(C16[i]), ref.value[i],
                  bf16_out_tolerance(c.K, ref.abs_sum[i], ref.value[i]))
          << name(c) << " bf16 out, element " << i;
    }
  }
}

TEST(Bf16Matmul, OneDnnAndTheWideningPathAgreeWithinTheirTolerances) {
  SKIP_WITHOUT_BF16_DOT_PRODUCTS();
  uint64_t seed = 100;
  for (const Case& c : cases()) {
    const std::vector<uint16_t> A = random_bf16(c.M * c.K, seed++),
                                B = random_bf16(c.K * c.N, seed++);
    const Reference ref = reference(c, A, B);
    const std::vector<float> widened = widened_product(c, A, B);
    std::vector<float> native(size_t(c.M * c.N));
    kernels::matmul_bf16_onednn(c.ta, c.tb, c.M, c.N, c.K, A.data(), B.data(), native.data(),
                                false);
    for (size_t i = 0; i < native.size(); ++i)  // each within its own bound of the exact sum
      ASSERT_NEAR(native[i], widened[i], 2 * fp32_sum_tolerance(c.K, ref.abs_sum[i]))
          << name(c) << " element " << i;
  }
}

// Row strides wider than the rows (the fused head's bf16 gradients sit in the first half of
// fp32 rows; an NF4 tile writes columns of its output) and C += op(A) op(B): each form against
// the reference, the operands' padding never read and C's never written.
TEST(Bf16Matmul, StridedOperandsAndAccumulationMatchTheReference) {
  SKIP_WITHOUT_BF16_DOT_PRODUCTS();
  uint64_t seed = 300;
  for (const Case& c : cases()) {
    const int64_t a_rows = c.ta ? c.K : c.M, a_cols = c.ta ? c.M : c.K;
    const int64_t b_rows = c.tb ? c.N : c.K, b_cols = c.tb ? c.K : c.N;
    const int64_t lda = a_cols + 7, ldb = b_cols + 3, ldc = c.N + 5;
    const std::vector<uint16_t> A = random_bf16(a_rows * a_cols, seed++),
                                B = random_bf16(b_rows * b_cols, seed++);
    std::vector<uint16_t> As(size_t(a_rows * lda), 0x7FC0), Bs(size_t(b_rows * ldb), 0x7FC0);
    for (int64_t r = 0; r < a_rows; ++r)  // NaN padding: a read of it would show
      std::copy_n(A.begin() + r * a_cols, a_cols, As.begin() + r * lda);
    for (int64_t r = 0; r < b_rows; ++r)
      std::copy_n(B.begin() + r * b_cols, b_cols, Bs.begin() + r * ldb);
    const Reference ref = reference(c, A, B);
    std::vector<float> C(size_t(c.M * ldc)), start(C.size());
    for (size_t i = 0; i < C.size(); ++i) start[i] = C[i] = float(int(i % 7) - 3);
    auto at = [&](int64_t i, int64_t j) { return size_t(i * ldc + j); };
    kernels::matmul_bf16_onednn(c.ta, c.tb, c.M, c.N, c.K, As.data(), Bs.data(), C.data(),
                                {.lda = lda, .ldb = ldb, .ldc = ldc, .accumulate = true});
    for (int64_t i = 0; i < c.M; ++i)
      for (int64_t j = 0; j < c.N; ++j) {
        const size_t r = size_t(i * c.N + j);
        ASSERT_NEAR(C[at(i, j)], start[at(i, j)] + ref.value[r],
                    fp32_sum_tolerance(c.K + 1, ref.abs_sum[r] + std::abs(start[at(i, j)])))
            << name(c) << " accumulated, element " << r;
      }
    kernels::matmul_bf16_onednn(c.ta, c.tb, c.M, c.N, c.K, As.data(), Bs.data(), C.data(),
                                {.lda = lda, .ldb = ldb, .ldc = ldc});
    for (int64_t i = 0; i < c.M; ++i)
      for (int64_t j = 0; j < c.N; ++j)
        ASSERT_NEAR(C[at(i, j)], ref.value[size_t(i * c.N + j)],
                    fp32_sum_tolerance(c.K, ref.abs_sum[size_t(i * c.N + j)]))
            << name(c) << " overwritten, element " << i * c.N + j;
    for (int64_t i = 0; i < c.M; ++i)  // the padding of C's rows is left alone
      for (int64_t j = c.N; j < ldc; ++j) ASSERT_EQ(C[at(i, j)], start[at(i, j)]) << name(c);
  }
}

// The fused LM head + cross-entropy of a bf16 graph on bf16 dot products: the definition in
// fp64 (with and without Gemma 2's soft cap), over three chunks, rows without a label skipped.
// The kernel rounds each logit gradient g to bf16 before the two backward products, as an
// unfused bf16 graph does, so dh and dW are within 2^-7 sum |g| |operand| of the exact values.
TEST(Bf16FusedHead, CrossEntropyOnBf16DotProductsMeetsTheDefinition) {
  SKIP_WITHOUT_BF16_DOT_PRODUCTS();
  ScopedPath path("onednn");
  const int64_t N = 40, D = 24, V = 3001, chunk = 16;
  const float scale = 0.1f;
  const std::vector<uint16_t> hb = random_bf16(N * D, 7), W = random_bf16(V * D, 8);
  std::vector<float> h(hb.size());
  kernels::bf16_to_f32_array(hb.data(), h.data(), N * D);
  std::vector<int32_t> labels(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) labels[size_t(i)] = i % 5 == 0 ? -100 : int32_t(i * 997 % V);
  auto w = [&](int64_t v, int64_t d) { return double(bf16_to_f32(W[size_t(v * D + d)])); };
  for (double cap : {0.0, 30.0}) {
    std::vector<float> dh(size_t(N * D), NAN), dW(size_t(V * D), NAN);
    const double loss = kernels::fused_bf16_linear_cross_entropy(
        h.data(), W.data(), labels.data(), scale, N, D, V, chunk, dh.data(), dW.data(), cap);
    double ref_loss = 0;
    std::vector<double> dh_ref(dh.size()), dh_tol(dh.size()), dW_ref(dW.size()), dW_tol(dW.size());
    std::vector<double> z(static_cast<size_t>(V)), g(static_cast<size_t>(V));
    for (int64_t n = 0; n < N; ++n) {
      const int32_t y = labels[size_t(n)];
      if (y == -100) continue;
      double mx = -INFINITY;
      for (int64_t v = 0; v < V; ++v) {
        double a = 0;
        for (int64_t d = 0; d < D; ++d) a += double(h[size_t(n * D + d)]) * w(v, d);
        z[size_t(v)] = cap > 0 ? cap * std::tanh(a / cap) : a;
        mx = std::max(mx, z[size_t(v)]);
      }
      double sum = 0;
      for (int64_t v = 0; v < V; ++v) sum += std::exp(z[size_t(v)] - mx);
      ref_loss += scale * (mx + std::log(sum) - z[size_t(y)]);
      for (int64_t v = 0; v < V; ++v) {
        const double slope = cap > 0 ? 1 - (z[size_t(v)] / cap) * (z[size_t(v)] / cap) : 1;
        const double p = std::exp(z[size_t(v)] - mx) / sum, bound = scale * (p + (v == y)) * slope;
        g[size_t(v)] = scale * (p - (v == y)) * slope;
        for (int64_t d = 0; d < D; ++d) {
          dh_ref[size_t(n * D + d)] += g[size_t(v)] * w(v, d);
          dh_tol[size_t(n * D + d)] += 0x1p-7 * bound * std::abs(w(v, d));
          dW_ref[size_t(v * D + d)] += g[size_t(v)] * double(h[size_t(n * D + d)]);
          dW_tol[size_t(v * D + d)] += 0x1p-7 * bound * std::abs(double(h[size_t(n * D + d)]));
        }
      }
    }
    EXPECT_NEAR(loss, ref_loss, 1e-5 * std::abs(ref_loss)) << "softcap " << cap;
    for (size_t i = 0; i < dh.size(); ++i)
      ASSERT_NEAR(dh[i], dh_ref[i], dh_tol[i] + 1e-7) << "softcap " << cap << ", dh element " << i;
    for (size_t i = 0; i < dW.size(); ++i)
      ASSERT_NEAR(dW[i], dW_ref[i], dW_tol[i] + 1e-7) << "softcap " << cap << ", dW element " << i;
  }
}

// The fused log-prob head (DPO, GRPO) of a bf16 graph on bf16 dot products, against the
// definition in fp64 over three chunks: log-probs and log-sum-exps from fp32 logits; the frozen
// head's E_p[W] and the trainable head's dh and dW from a softmax / gradient rounded to bf16.
TEST(Bf16FusedHead, LogProbsOnBf16DotProductsMeetTheDefinition) {
  SKIP_WITHOUT_BF16_DOT_PRODUCTS();
  ScopedPath path("onednn");
  const int64_t N = 40, D = 24, V = 3001, chunk = 16;
  const std::vector<uint16_t> hb = random_bf16(N * D, 17), W = random_bf16(V * D, 18);
  std::vector<float> h(hb.size());
  kernels::bf16_to_f32_array(hb.data(), h.data(), N * D);
  std::vector<int32_t> labels(static_cast<size_t>(N));
  std::vector<float> dlogp(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) {
    labels[size_t(i)] = i % 5 == 0 ? -100 : int32_t(i * 997 % V);
    dlogp[size_t(i)] = 0.05f * float(i % 7 - 3);
  }
  kernels::LogProbHead<float> head;
  head.bf16 = W.data();
  head.V = V;
  head.D = D;
  std::vector<float> logp(static_cast<size_t>(N)), lse(logp.size()), zsum(logp.size()),
      expect(static_cast<size_t>(N * D));
  kernels::fused_linear_log_probs<float>(h.data(), labels.data(), head, N, chunk, logp.data(),
                                         lse.data(), zsum.data(), expect.data());
  std::vector<float> dh(size_t(N * D), NAN), dW(size_t(V * D), NAN);
  kernels::fused_linear_log_probs_backward<float>(h.data(), labels.data(), lse.data(), dlogp.data(),
                                                  head, N, chunk, dh.data(), dW.data());
  auto w = [&](int64_t v, int64_t d) { return double(bf16_to_f32(W[size_t(v * D + d)])); };
  std::vector<double> e_ref(expect.size()), e_tol(expect.size()), dh_ref(dh.size()),
      dh_tol(dh.size()), dW_ref(dW.size()), dW_tol(dW.size()), z(static_cast<size_t>(V));
  for (int64_t n = 0; n < N; ++n) {
    const int32_t y = labels[size_t(n)];
    if (y == -100) continue;
    double mx = -INFINITY, sum = 0;
    for (int64_t v = 0; v < V; ++v) {
      z[size_t(v)] = 0;
      for (int64_t d = 0; d < D; ++d) z[size_t(v)] += double(h[size_t(n * D + d)]) * w(v, d);
      mx = std::max(mx, z[size_t(v)]);
    }
    for (int64_t v = 0; v < V; ++v) sum += std::exp(z[size_t(v)] - mx);
    const double l = mx + std::log(sum), g = dlogp[size_t(n)];
    EXPECT_NEAR(lse[size_t(n)], l, 1e-5 * std::abs(l)) << "row " << n;
    EXPECT_NEAR(logp[size_t(n)], z[size_t(y)] - l, 1e-5 * std::abs(l)) << "row " << n;
    for (int64_t v = 0; v < V; ++v) {
      const double p = std::exp(z[size_t(v)] - l), dz = g * ((v == y) - p);
      for (int64_t d = 0; d < D; ++d) {
        const size_t nd = size_t(n * D + d), vd = size_t(v * D + d);
        e_ref[nd] += p * w(v, d);
        e_tol[nd] += 0x1p-7 * p * std::abs(w(v, d));
        dh_ref[nd] += dz * w(v, d);
        dh_tol[nd] += 0x1p-7 * std::abs(g) * (p + (v == y)) * std::abs(w(v, d));
        dW_ref[vd] += dz * double(h[nd]);
        dW_tol[vd] += 0x1p-7 * std::abs(g) * (p + (v == y)) * std::abs(double(h[nd]));
      }
    }
  }
  for (size_t i = 0; i < expect.size(); ++i)
    ASSERT_NEAR(expect[i], e_ref[i], e_tol[i] + 1e-7) << "E_p[W] element " << i;
  for (size_t i = 0; i < dh.size(); ++i)
    ASSERT_NEAR(dh[i], dh_ref[i], dh_tol[i] + 1e-7) << "dh element " << i;
  for (size_t i = 0; i < dW.size(); ++i)
    ASSERT_NEAR(dW[i], dW_ref[i], dW_tol[i] + 1e-7) << "dW element " << i;
}

// An NF4 weight on bf16 dot products (QLoRA's base in a bf16 graph): y = x W^T and dx = dy W
// over three tiles of rows, against fp64 products of the operands' bf16 values with W's
// dequantized values rounded to bf16 (what the kernel multiplies); the fp32 tiles' path runs
// instead for activations that do not hold bf16 values.
TEST(Bf16Nf4Matmul, WeightTilesMultiplyAsBf16) {
  SKIP_WITHOUT_BF16_DOT_PRODUCTS();
  ScopedPath path("onednn");
  const int64_t O = 600, K = 1024, N = 37;  // nf4_tile_rows(600, 1024) = 256: three tiles
  ASSERT_EQ(kernels::nf4_tile_rows(O, K), 256);
  const Nf4Weight nf4(O, K, 5, 0.05f);
  const kernels::NF4View view = nf4.view();
  std::vector<uint16_t> wb(size_t(O * K));
  kernels::f32_to_bf16_array(nf4.dequantized().data(), wb.data(), O * K);
  const std::vector<uint16_t> xb = random_bf16(N * K, 21), dyb = random_bf16(N * O, 22);
  std::vector<float> x(xb.size()), dy(dyb.size()), y(size_t(N * O), NAN), dx(size_t(N * K), NAN);
  kernels::bf16_to_f32_array(xb.data(), x.data(), N * K);
  kernels::bf16_to_f32_array(dyb.data(), dy.data(), N * O);
  ASSERT_TRUE(kernels::nf4_matmul_bf16(view, x.data(), N, y.data()));
  ASSERT_TRUE(kernels::nf4_matmul_backward_bf16(view, dy.data(), N, dx.data()));
  const Reference fwd = reference({false, true, N, O, K}, xb, wb);
  const Reference bwd = reference({false, false, N, K, O}, dyb, wb);
  for (size_t i = 0; i < y.size(); ++i)
    ASSERT_NEAR(y[i], fwd.value[i], fp32_sum_tolerance(K, fwd.abs_sum[i])) << "y element " << i;
  for (size_t i = 0; i < dx.size(); ++i)
    ASSERT_NEAR(dx[i], bwd.value[i], fp32_sum_tolerance(O, bwd.abs_sum[i])) << "dx element " << i;
  x[3] = std::nextafter(x[3], 1.0f);  // no longer a bf16 value: the fp32 tiles' path
  EXPECT_FALSE(kernels::nf4_matmul_bf16(view, x.data(), N, y.data()));
}

// QLoRA's frozen NF4 head in a bf16 graph on bf16 dot products, through the fused cross-entropy
// and the fused log-probs (E_p[W] of the frozen route), over three chunks and three tiles of
// rows: against fp64 with W's dequantized values rounded to bf16, the softmax / gradient rounded
// to bf16 before the products that read it (bounds as in the dense head's tests).
TEST(Bf16FusedHead, Nf4HeadOnBf16DotProductsMeetsTheDefinition) {
  SKIP_WITHOUT_BF16_DOT_PRODUCTS();
  ScopedPath path("onednn");
  const int64_t N = 40, D = 1024, V = 700, chunk = 16;  // nf4_tile_rows(700, 1024) = 256
  const float scale = 0.1f;
  const Nf4Weight nf4(V, D, 9, 0.02f);
  const kernels::NF4View W = nf4.view();
  const std::vector<float> deq = nf4.dequantized();
  auto w = [&](int64_t v, int64_t d) {
    return double(bf16_to_f32(f32_to_bf16(deq[size_t(v * D + d)])));
  };
  const std::vector<uint16_t> hb = random_bf16(N * D, 31);
  std::vector<float> h(hb.size());
  kernels::bf16_to_f32_array(hb.data(), h.data(), N * D);
  std::vector<int32_t> labels(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) labels[size_t(i)] = i % 5 == 0 ? -100 : int32_t(i * 97 % V);

  std::vector<float> dh(size_t(N * D), NAN), expect(dh.size(), NAN);
  std::vector<float> logp(static_cast<size_t>(N)), lse(logp.size()), zsum(logp.size());
  const double loss = kernels::fused_nf4_linear_cross_entropy<float>(h.data(), W, labels.data(),
                                                                     scale, N, chunk, dh.data());
  kernels::LogProbHead<float> head;
  head.nf4 = &W;
  head.V = V;
  head.D = D;
  kernels::fused_linear_log_probs<float>(h.data(), labels.data(), head, N, chunk, logp.data(),
                                         lse.data(), zsum.data(), expect.data());
  double ref_loss = 0;
  std::vector<double> z;
  for (int64_t n = 0; n < N; ++n) {
    const int32_t y = labels[size_t(n)];
    if (y == -100) continue;
    const double l = row_logits(h, n, D, V, w, z);
    ref_loss += scale * (l - z[size_t(y)]);
    EXPECT_NEAR(lse[size_t(n)], l, 1e-5 * std::abs(l)) << "row " << n;
    EXPECT_NEAR(logp[size_t(n)], z[size_t(y)] - l, 1e-5 * std::abs(l)) << "row " << n;
    for (int64_t d = 0; d < D; ++d) {
      double g = 0, g_tol = 0, e = 0, e_tol = 0;
      for (int64_t v = 0; v < V; ++v) {
        const double p = std::exp(z[size_t(v)] - l);
        g += scale * (p - (v == y)) * w(v, d);
        g_tol += 0x1p-7 * scale * (p + (v == y)) * std::abs(w(v, d));
        e += p * w(v, d);
        e_tol += 0x1p-7 * p * std::abs(w(v, d));
      }
      ASSERT_NEAR(dh[size_t(n * D + d)], g, g_tol + 1e-7) << "dh row " << n << " column " << d;
      ASSERT_NEAR(expect[size_t(n * D + d)], e, e_tol + 1e-7)
          << "E_p[W] row " << n << " column " << d;
    }
  }
  EXPECT_NEAR(loss, ref_loss, 1e-5 * std::abs(ref_loss));
}

// QAT's fake-quantized bf16 head (trainable) in a bf16 graph on bf16 dot products: fq(W)
// formed a tile at a time and rounded to bf16, over three chunks and three tiles; the loss, dh
// and the straight-through dW = dz^T h against fp64 (bounds as in the dense head's test).
TEST(Bf16FusedHead, FakeQuantizedHeadOnBf16DotProductsMeetsTheDefinition) {
  SKIP_WITHOUT_BF16_DOT_PRODUCTS();
  ScopedPath path("onednn");
  const int64_t N = 40, D = 1024, V = 600, chunk = 16;  // fake_quant_tile_rows(600, 1024) = 256
  ASSERT_EQ(kernels::fake_quant_tile_rows(V, D), 256);
  const float scale = 0.1f;
  const kernels::FakeQuantSpec spec{kernels::FakeQuant::Int4Symmetric, 32};
  const std::vector<uint16_t> Wb = random_bf16(V * D, 41), hb = random_bf16(N * D, 42);
  std::vector<float> Ww(Wb.size()), Wq(Wb.size()), h(hb.size());
  kernels::bf16_to_f32_array(Wb.data(), Ww.data(), V * D);
  kernels::fake_quantize_rows<float>(spec, Ww.data(), Wq.data(), V, D);
  kernels::bf16_to_f32_array(hb.data(), h.data(), N * D);
  auto w = [&](int64_t v, int64_t d) {
    return double(bf16_to_f32(f32_to_bf16(Wq[size_t(v * D + d)])));
  };
  std::vector<int32_t> labels(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) labels[size_t(i)] = i % 5 == 0 ? -100 : int32_t(i * 97 % V);
  std::vector<float> dh(size_t(N * D), NAN), dW(size_t(V * D), NAN);
  const double loss = kernels::fused_fake_quant_bf16_linear_cross_entropy(
      spec, h.data(), Wb.data(), labels.data(), scale, N, D, V, chunk, dh.data(), dW.data());
  double ref_loss = 0;
  std::vector<double> z, dW_ref(dW.size()), dW_tol(dW.size());
  for (int64_t n = 0; n < N; ++n) {
    const int32_t y = labels[size_t(n)];
    if (y == -100) continue;
    const double l = row_logits(h, n, D, V, w, z);
    ref_loss += scale * (l - z[size_t(y)]);
    for (int64_t d = 0; d < D; ++d) {
      double g = 0, g_tol = 0;
      for (int64_t v = 0; v < V; ++v) {
        const double p = std::exp(z[size_t(v)] - l), hd = double(h[size_t(n * D + d)]);
        g += scale * (p - (v == y)) * w(v, d);
        g_tol += 0x1p-7 * scale * (p + (v == y)) * std::abs(w(v, d));
        dW_ref[size_t(v * D + d)] += scale * (p - (v == y)) * hd;
        dW_tol[size_t(v * D + d)] += 0x1p-7 * scale * (p + (v == y)) * std::abs(hd);
      }
      ASSERT_NEAR(dh[size_t(n * D + d)], g, g_tol + 1e-7) << "dh row " << n << " column " << d;
    }
  }
  EXPECT_NEAR(loss, ref_loss, 1e-5 * std::abs(ref_loss));
  for (size_t i = 0; i < dW.size(); ++i)
    ASSERT_NEAR(dW[i], dW_ref[i], dW_tol[i] + 1e-7) << "dW element " << i;
}

TEST(Bf16Matmul, EmptySumsWriteZeros) {
  SKIP_WITHOUT_BF16_DOT_PRODUCTS();
  std::vector<float> C(6, NAN);
  kernels::matmul_bf16_onednn(false, false, 2, 3, 0, nullptr, nullptr, C.data(), false);
  for (float x : C) EXPECT_EQ(x, 0.0f);
}

TEST(Bf16Matmul, TheEnvironmentChoosesThePathAndIsValidated) {
  {
    ScopedPath p("widening");
    EXPECT_EQ(kernels::bf16_matmul_path(), kernels::Bf16MatmulPath::Widening);
    EXPECT_NE(kernels::bf16_matmul_description().find("FUSETUNE_BF16_MATMUL=widening"),
              std::string::npos)
        << kernels::bf16_matmul_description();
  }
  {
    ScopedPath p("auto");
    const bool native = kernels::cpu_has_bf16_dot_products();
    EXPECT_EQ(kernels::bf16_matmul_path(),
              native ? kernels::Bf16MatmulPath::OneDnn : kernels::Bf16MatmulPath::Widening);
    EXPECT_NE(kernels::bf16_matmul_description().find(native ? "oneDNN " : "no bf16 dot products"),
              std::string::npos)
        << kernels::bf16_matmul_description();
  }
  {
    ScopedPath p("onednn");
    if (kernels::cpu_has_bf16_dot_products()) {
      EXPECT_EQ(kernels::bf16_matmul_path(), kernels::Bf16MatmulPath::OneDnn);
    } else {
      EXPECT_THROW(kernels::bf16_matmul_path(), Error);
    }
  }
  ScopedPath p("fast");
  try {
    kernels::bf16_matmul_path();
    FAIL() << "FUSETUNE_BF16_MATMUL=fast accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("FUSETUNE_BF16_MATMUL=fast"), std::string::npos) << m;
    EXPECT_NE(m.find("auto"), std::string::npos) << m;
    EXPECT_NE(m.find("widening"), std::string::npos) << m;
    EXPECT_NE(m.find("onednn"), std::string::npos) << m;
  }
}

TEST(Bf16Matmul, TheRuntimeEntryTakesOnlyBf16OperandsOnTheOneDnnPath) {
  Tensor a = Tensor::zeros({2, 3}, DType::BF16), b = Tensor::zeros({3, 4}, DType::BF16);
  Tensor c = Tensor::empty({2, 4}, DType::BF16);
  {
    ScopedPath p("widening");
    EXPECT_FALSE(kernels::matmul_bf16_native(false, false, a, b, c));
  }
  if (!kernels::cpu_has_bf16_dot_products()) return;
  ScopedPath p("auto");
  EXPECT_TRUE(kernels::matmul_bf16_native(false, false, a, b, c));
  const Tensor a32 = Tensor::zeros({2, 3}, DType::F32);  // an fp32 operand: widening path
  EXPECT_FALSE(kernels::matmul_bf16_native(false, false, a32, b, c));
  const Tensor batched = Tensor::zeros({2, 2, 3}, DType::BF16);
  const Tensor batched_b = Tensor::zeros({2, 3, 4}, DType::BF16);
  Tensor batched_c = Tensor::empty({2, 2, 4}, DType::BF16);
  EXPECT_FALSE(kernels::matmul_bf16_native(false, false, batched, batched_b, batched_c));
}

// A bf16 graph's MatMul node, eager and planned, on both paths: the runtime reaches oneDNN
// beneath the same node kernels, and either path meets the reference.
TEST(Bf16Matmul, AGraphMatMulMeetsTheReferenceOnBothPaths) {
  uint64_t seed = 500;
  for (const Case& c : {Case{false, true, 37, 70, 131}, Case{false, false, 37, 70, 131},
                        Case{true, false, 70, 37, 131}, Case{true, true, 9, 17, 1001}}) {
    const std::vector<uint16_t> A = random_bf16(c.M * c.K, seed++),
                                B = random_bf16(c.K * c.N, seed++);
    const Reference ref = reference(c, A, B);
    Graph g(DType::BF16);
    const Value a = g.input("a", c.ta ? Shape{c.K, c.M} : Shape{c.M, c.K}, DType::BF16);
    const Value b = g.input("b", c.tb ? Shape{c.N, c.K} : Shape{c.K, c.N}, DType::BF16);
    Attrs attrs;
    attrs.trans_a = c.ta;
    attrs.trans_b = c.tb;
    g.mark_output("c", g.add(Op::MatMul, {a, b}, attrs)[0]);
    TensorMap x;
    x["a"] = Tensor::empty(g.type(a).shape, DType::BF16);
    x["b"] = Tensor::empty(g.type(b).shape, DType::BF16);
    std::copy(A.begin(), A.end(), x["a"].data<uint16_t>());
    std::copy(B.begin(), B.end(), x["b"].data<uint16_t>());
    const MemoryPlan plan = plan_memory(g);
    for (const char* path : {"widening", "auto"}) {
      ScopedPath p(path);
      const auto eager = EagerExecutor(g).run(x, {});
      const auto planned = PlanExecutor(g, plan).run(x, {});
      for (const auto* got : {&eager[0], &planned[0]}) {
        ASSERT_EQ(got->dtype(), DType::BF16);
        for (size_t i = 0; i < ref.value.size(); ++i)
          ASSERT_NEAR(bf16_to_f32(got->data<uint16_t>()[i]), ref.value[i],
                      bf16_out_tolerance(c.K, ref.abs_sum[i], ref.value[i]))
              << name(c) << " " << path << (got == &eager[0] ? " eager" : " planned") << " element "
              << i;
      }
    }
  }
}

// Two OpenMP runtimes in one process would each keep a thread pool and ignore the other's
// settings. OpenBLAS and oneDNN are built on GCC's libgomp (GOMP_* entry points); our code
// calls libgomp under g++, and libomp under clang (__kmpc_* entry points), where libomp comes
// first in the link order and so also serves every GOMP_* call. Either way one library must
// answer both.
TEST(OpenMpRuntime, OurCodeOpenBlasAndOneDnnShareOneRuntime) {
  auto library_of = [](const char* symbol) -> std::string {
    void* p = dlsym(RTLD_DEFAULT, symbol);
    Dl_info info{};
    if (!p || !dladdr(p, &info) || !info.dli_fname) return {};
    return info.dli_fname;
  };
  const std::string gomp = library_of("GOMP_parallel");
  ASSERT_FALSE(gomp.empty()) << "no GOMP_parallel in the process: OpenBLAS is not the OpenMP build";
  EXPECT_EQ(library_of("omp_get_max_threads"), gomp);
  const std::string kmpc = library_of("__kmpc_fork_call");
  if (!kmpc.empty()) {
    EXPECT_EQ(kmpc, gomp) << "clang's OpenMP calls and libgomp's go apart";
  }
}
