// Knowledge distillation's divergences (losses/distillation.h, kernels/cpu/divergence.h), each
// against an independent formulation written out here in double precision from the papers'
// formulas (torchtune's ForwardKLLoss / ReverseKLLoss, TRL's generalized JSD), and against
// float64 finite differences; masked rows (label -100) count nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "fusetune/graph/autodiff.h"
#include "fusetune/kernels/cpu/divergence.h"
#include "fusetune/losses/distillation.h"
#include "fusetune/runtime/eager_executor.h"
#include "gradcheck.h"
#include "tensor_checks.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace distillation_loss_test {

constexpr int64_t N = 6, V = 7;

struct Logits {
  std::vector<double> student, teacher;
  std::vector<int32_t> labels = {3, -100, 0, 6, -100, 2};
  explicit Logits(uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u(-3, 3);
    for (int64_t i = 0; i < N * V; ++i) student.push_back(u(rng));
    for (int64_t i = 0; i < N * V; ++i) teacher.push_back(u(rng));
  }
};

std::vector<double> softmax_row(const double* z, double T) {
  std::vector<double> p(V);
  double s = 0;
  for (int64_t v = 0; v < V; ++v) s += std::exp(z[v] / T);
  for (int64_t v = 0; v < V; ++v) p[v] = std::exp(z[v] / T) / s;
  return p;
}

// The definitions, term by term: p the teacher's distribution, q the student's.
double reference(const DistillationLoss& l, const Logits& x) {
  double total = 0;
  for (int64_t i = 0; i < N; ++i) {
    if (x.labels[i] == -100) continue;
    const auto p = softmax_row(&x.teacher[i * V], l.temperature);
    const auto q = softmax_row(&x.student[i * V], l.temperature);
    double row = 0;
    for (int64_t v = 0; v < V; ++v) {
      const double m = l.beta * p[v] + (1 - l.beta) * q[v];
      switch (l.kind) {
        case KdDivergence::ForwardKL:  // torchtune: -sum p log q
          row -= p[v] * std::log(q[v]);
          break;
        case KdDivergence::ReverseKL:  // KL(q || p)
          row += q[v] * std::log(q[v] / p[v]);
          break;
        case KdDivergence::GeneralizedJSD:
          if (l.beta == 0)
            row += p[v] * std::log(p[v] / q[v]);  // TRL: KL(p || q)
          else if (l.beta == 1)
            row += q[v] * std::log(q[v] / p[v]);  // TRL: KL(q || p)
          else
            row += l.beta * p[v] * std::log(p[v] / m) + (1 - l.beta) * q[v] * std::log(q[v] / m);
          break;
      }
    }
    total += row;
  }
  return total;
}

std::vector<DistillationLoss> all_losses() {
  std::vector<DistillationLoss> out;
  for (double T : {1.0, 2.5}) {
    out.push_back({KdDivergence::ForwardKL, 0.5, T});
    out.push_back({KdDivergence::ReverseKL, 0.5, T});
    for (double beta : {0.0, 0.1, 0.5, 0.9, 1.0})
      out.push_back({KdDivergence::GeneralizedJSD, beta, T});
  }
  return out;
}

Tensor f64_tensor(Shape s, const std::vector<double>& v) {
  Tensor t = Tensor::empty(std::move(s), DType::F64);
  std::copy(v.begin(), v.end(), t.data<double>());
  return t;
}

TEST(Distillation, KindsAreTheKernelsKinds) {
  EXPECT_EQ(int(KdDivergence::ForwardKL), int(kernels::DivergenceKind::ForwardKL));
  EXPECT_EQ(int(KdDivergence::ReverseKL), int(kernels::DivergenceKind::ReverseKL));
  EXPECT_EQ(int(KdDivergence::GeneralizedJSD), int(kernels::DivergenceKind::GeneralizedJSD));
}

TEST(Distillation, EachDivergenceMatchesItsDefinitionAndFiniteDifferences) {
  const Logits x(7);
  for (const DistillationLoss& l : all_losses()) {
    SCOPED_TRACE(std::string(l.name()) + " beta " + std::to_string(l.beta) + " T " +
                 std::to_string(l.temperature));
    Graph g(DType::F64);
    Builder b(g);
    Value s = g.param("student", {N, V}, true);
    Value t = g.input("teacher", {N, V}, DType::F64);
    Value labels = g.input("labels", {N}, DType::I32);
    Value loss = build_divergence(b, l, s, t, labels);
    g.mark_output("loss", loss);
    TensorMap params{{"student", f64_tensor({N, V}, x.student)}};
    Tensor lab = Tensor::empty({N}, DType::I32);
    std::copy(x.labels.begin(), x.labels.end(), lab.data<int32_t>());
    TensorMap in{{"teacher", f64_tensor({N, V}, x.teacher)}, {"labels", lab}};
    EagerExecutor ex(g);
    EXPECT_NEAR(ex.run(in, params)[0].data<double>()[0], reference(l, x), 1e-12);
    check_gradients(g, loss, params, in, 24, 1e-6);
  }
}

TEST(Distillation, MaskedRowsGetNoGradientAndIdenticalModelsNoLoss) {
  Logits x(3);
  std::vector<double> d(N * V, 1.0);
  kernels::DivergenceParams p{kernels::DivergenceKind::ReverseKL, 0.5, 1.0};
  kernels::divergence_backward<double>(1.0, x.student.data(), x.teacher.data(), x.labels.data(),
                                       d.data(), N, V, p);
  for (int64_t v = 0; v < V; ++v) EXPECT_EQ(d[1 * V + v], 0.0);
  // KL of a distribution to itself is 0 (the generalized JSD and reverse KL); torchtune's
  // forward KL is then the entropy.
  for (auto kind : {kernels::DivergenceKind::ReverseKL, kernels::DivergenceKind::GeneralizedJSD})
    EXPECT_NEAR(kernels::divergence_sum<double>(x.student.data(), x.student.data(), x.labels.data(),
                                                N, V, {kind, 0.3, 1.5}),
                0.0, 1e-12);
}

// The float rows (vectorized exps, sums in blocks of 512 lanes then double) against the
// double rows the test above checks against the definitions: rows of 1,100 logits (three
// blocks, the last partial), every kind, beta and temperature, the gradient written over the
// teacher's own logits as the fused kernel does.
TEST(Distillation, FloatRowsMatchTheDoubleRowsWithinFloatRounding) {
  constexpr int64_t R = 4, W = 1100;
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(-8, 8);
  std::vector<double> s(R * W), t(R * W);
  for (double& x : s) x = u(rng);
  for (double& x : t) x = u(rng);
  const std::vector<int32_t> labels = {1, -100, 7, 3};
  for (const DistillationLoss& l : all_losses()) {
    SCOPED_TRACE(std::string(l.name()) + " beta " + std::to_string(l.beta) + " T " +
                 std::to_string(l.temperature));
    const kernels::DivergenceParams p{kernels::DivergenceKind(int(l.kind)), l.beta, l.temperature};
    const std::vector<float> sf(s.begin(), s.end()), tf(t.begin(), t.end());
    std::vector<double> sd(sf.begin(), sf.end()), td(tf.begin(), tf.end()), dd(R * W);
    const double want =
        kernels::divergence_sum<double>(sd.data(), td.data(), labels.data(), R, W, p);
    EXPECT_NEAR(kernels::divergence_sum<float>(sf.data(), tf.data(), labels.data(), R, W, p), want,
                2e-6 * std::abs(want) + 1e-6);
    kernels::divergence_backward<double>(0.7, sd.data(), td.data(), labels.data(), dd.data(), R, W,
                                         p);
    std::vector<float> df = tf;  // in place over the teacher's logits
    for (int64_t r = 0; r < R; ++r)
      if (labels[size_t(r)] != -100)
        kernels::divergence_row<float>(&sf[r * W], &df[r * W], W, p, &df[r * W], 0.7);
    double max_d = 0, err = 0;
    for (int64_t i = 0; i < R * W; ++i) {
      if (labels[size_t(i / W)] == -100) continue;
      max_d = std::max(max_d, std::abs(dd[size_t(i)]));
      err = std::max(err, std::abs(double(df[size_t(i)]) - dd[size_t(i)]));
    }
    EXPECT_LT(err, 1e-5 * max_d);
  }
}

TEST(Distillation, BadParametersAreErrors) {
  Logits x(1);
  EXPECT_ANY_THROW(kernels::divergence_sum<double>(x.student.data(), x.teacher.data(),
                                                   x.labels.data(), N, V,
                                                   {kernels::DivergenceKind::ForwardKL, 0.5, 0}));
  EXPECT_ANY_THROW(
      kernels::divergence_sum<double>(x.student.data(), x.teacher.data(), x.labels.data(), N, V,
                                      {kernels::DivergenceKind::GeneralizedJSD, 1.5, 1}));
}

}  // namespace distillation_loss_test
