// bf16 parameters and bf16 optimizer state: stochastic rounding (optim/stochastic_rounding.h),
// AdamW / AdamW8bit / SGD on BF16 parameters, state_dtype bf16, and gradient clipping of BF16
// gradients.
#include <omp.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "checks.h"
#include "fusetune/config/recipe_schemas.h"
#include "fusetune/config/schema.h"
#include "fusetune/optim/adamw.h"
#include "fusetune/optim/adamw8bit.h"
#include "fusetune/optim/grad_clip.h"
#include "fusetune/optim/sgd.h"
#include "fusetune/optim/stochastic_rounding.h"
#include "fusetune/recipes/recipe_setup.h"
#include "fusetune/util/error.h"
#include "tensor_checks.h"

using namespace fusetune;
using fusetune::testing::error_of;
using fusetune::testing::same_bits;

namespace {

Tensor bf16_tensor(const std::vector<double>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::BF16);
  for (size_t i = 0; i < v.size(); ++i) t.data<uint16_t>()[i] = f32_to_bf16(float(v[i]));
  return t;
}

Tensor f32_tensor(const std::vector<double>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::F32);
  for (size_t i = 0; i < v.size(); ++i) t.data<float>()[i] = float(v[i]);
  return t;
}

double at(const Tensor& t, int64_t i) { return element_as_double(t, i); }

StateMap to_map(const NamedTensors& named) {
  StateMap m;
  for (const auto& [k, t] : named) m[k] = t.clone();
  return m;
}

// ---- stochastic rounding ---------------------------------------------------------------------

TEST(OptimBf16, StochasticRoundingIsUnbiased) {
  // Values strictly between two bf16 neighbours: x = lo + frac * ulp.
  for (const double base : {1.0, -1.0, 0.75, 0.0029296875, -96.0}) {  // bf16 values
    const double ulp = std::ldexp(1.0, std::ilogb(base) - 7);         // bf16's ulp at |base|
    for (const double frac : {0.3, 0.02, 0.9}) {
      const float x = float(base + (base > 0 ? 1 : -1) * frac * ulp);
      const float lo = bf16::to_f32(uint16_t(std::bit_cast<uint32_t>(x) >> 16));  // truncated
      ASSERT_NE(lo, x);
      const bf16::Stream s(7, 3, "layers.0.w");
      const int64_t n = 200000;
      double sum = 0;
      int64_t up = 0;
      for (int64_t i = 0; i < n; ++i) {
        const float r = bf16::to_f32(s.round(x, i, bf16::Buffer::Value));
        ASSERT_TRUE(r == lo || std::abs(double(r) - double(lo)) == ulp) << r;  // a neighbour
        up += r != lo;
        sum += r;
      }
      // Rounds away from zero with probability frac: a binomial, checked to 5 sigma.
      const double p = double(up) / double(n);
      const double sigma_p = std::sqrt(frac * (1 - frac) / double(n));
      EXPECT_NEAR(p, frac, 5 * sigma_p) << "x " << x;
      // Hence the mean is x (5 sigma of the mean: ulp * sigma_p).
      EXPECT_NEAR(sum / double(n), double(x), 5 * ulp * sigma_p + 1e-12 * std::abs(x)) << x;
    }
  }
  // bf16 values are kept exactly; non-finite values stay what they are.
  const bf16::Stream s(0, 1, "w");
  const bf16::Buffer b = bf16::Buffer::ExpAvgSq;
  for (int64_t i = 0; i < 1000; ++i) {
    EXPECT_EQ(bf16::to_f32(s.round(1.0f, i, b)), 1.0f);
    EXPECT_EQ(bf16::to_f32(s.round(-0.375f, i, b)), -0.375f);
    EXPECT_EQ(bf16::to_f32(s.round(INFINITY, i, b)), INFINITY);
    EXPECT_TRUE(std::isnan(bf16::to_f32(s.round(NAN, i, b))));
  }
  // round_nearest is core/dtype.h's conversion.
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> u(-10, 10);
  for (int i = 0; i < 10000; ++i) {
    const float x = u(gen);
    EXPECT_EQ(bf16::round_nearest(x), f32_to_bf16(x));
  }
}

TEST(OptimBf16, StochasticRoundingBitsAreACounterBasedHash) {
  using B = bf16::Buffer;
  const bf16::Stream a(42, 10, "w"), a2(42, 10, "w");
  const std::vector<std::pair<bf16::Stream, B>> others = {{bf16::Stream(43, 10, "w"), B::Value},
                                                          {bf16::Stream(42, 11, "w"), B::Value},
                                                          {bf16::Stream(42, 10, "v"), B::Value},
                                                          {bf16::Stream(42, 10, "w"), B::ExpAvg}};
  // The same (seed, step, name, buffer, index) gives the same bits, in any order.
  for (int64_t i = 999; i >= 0; --i) EXPECT_EQ(a.bits(i, B::Value), a2.bits(i, B::Value));
  // Changing any of seed, step, name, buffer changes the bits (equal by chance: 1 in 65536).
  for (const auto& [o, buffer] : others) {
    int same = 0;
    for (int64_t i = 0; i < 1000; ++i) same += a.bits(i, B::Value) == o.bits(i, buffer);
    EXPECT_LE(same, 3);
  }
  // The bits are uniform, in every buffer's lane: each of 16 bins of the top 4 bits holds
  // ~1/16 of them.
  const int n = 160000;
  for (const B buffer : {B::Value, B::ExpAvg, B::ExpAvgSq, B::Momentum}) {
    std::vector<int> bins(16, 0);
    for (int64_t i = 0; i < n; ++i) ++bins[size_t(a.bits(i, buffer) >> 12)];
    for (int c : bins) EXPECT_NEAR(c, n / 16, 5 * std::sqrt(n / 16.0)) << "bin";
  }
  // The name hash is FNV-1a (the same on every platform): its published value for "a".
  EXPECT_EQ(bf16::name_hash("a"), 0xAF63DC4C8601EC8Cull);
}

// THE property stochastic rounding is for: a bf16 parameter at 1.0 receiving SGD updates of
// 1e-4 (lr 1e-4, gradient 1), below half of bf16's ulp near 1.0 (2^-8 / 2 = 0.00195 below 1.0,
// 2^-7 / 2 above). Exact arithmetic after 1000 steps: 1 - 1000 * 1e-4 = 0.9.
TEST(OptimBf16, RoundToNearestLosesSmallUpdatesWhereStochasticRoundingDoesNot) {
  const int steps = 1000;
  const double lr = 1e-4, grad = 1.0;
  const double expected = 1.0 - steps * lr * grad;  // 0.9
  // Round-to-nearest (what writing the fp32 update back with f32_to_bf16 would do): 1 - 1e-4
  // is nearer to 1.0 than to 1 - 2^-8, so the parameter never moves.
  uint16_t rn = f32_to_bf16(1.0f);
  for (int k = 0; k < steps; ++k) rn = f32_to_bf16(bf16_to_f32(rn) - float(lr * grad));
  EXPECT_EQ(bf16_to_f32(rn), 1.0f);

  // SGD on a BF16 parameter (stochastic rounding): 256 elements, each its own random stream.
  const int64_t n = 256;
  Tensor p = bf16_tensor(std::vector<double>(n, 1.0));
  Tensor g = bf16_tensor(std::vector<double>(n, grad));
  SGDOptions o;
  o.seed = 1234;
  SGD opt(o);
  std::vector<ParamRef> params = {{"w", &p, &g}};
  for (int k = 0; k < steps; ++k) opt.step(params, lr);
  // Each step rounds up or down by one ulp (2^-8 in [0.5, 1)) with probability q = 1e-4/2^-8:
  // variance per step q (1 - q) ulp^2, summed over 1000 steps: sigma ~ 0.02 per element,
  // 0.0012 for the mean of 256.
  const double ulp = std::ldexp(1.0, -8), q = lr * grad / ulp;
  const double sigma = std::sqrt(steps * q * (1 - q)) * ulp;
  double mean = 0;
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(at(p, i), expected, 5 * sigma) << i;
    mean += at(p, i) / double(n);
  }
  EXPECT_NEAR(mean, expected, 5 * sigma / std::sqrt(double(n)));
  EXPECT_NEAR(mean, expected, 0.01 * expected);  // "within a few %": here within 1%

  // Deterministic: the same seed reproduces every bit; another seed gives other bits.
  Tensor p2 = bf16_tensor(std::vector<double>(n, 1.0)), p3 = p2.clone();
  SGD again(o);
  SGDOptions o3 = o;
  o3.seed = 99;
  SGD other(o3);
  std::vector<ParamRef> params2 = {{"w", &p2, &g}}, params3 = {{"w", &p3, &g}};
  for (int k = 0; k < steps; ++k) {
    again.step(params2, lr);
    other.step(params3, lr);
  }
  EXPECT_TRUE(same_bits(p, p2));
  EXPECT_FALSE(same_bits(p, p3));
}

// ---- AdamW on bf16 parameters ----------------------------------------------------------------

const std::vector<double> kBf16P0 = {0.5, -1.25, 2.0, 0.0, -0.09375, 0.8125};
const std::vector<std::vector<double>> kBf16Grads = {{0.3, -0.2, 0.0, 1.5, -0.01, 0.125},
                                                     {-0.1, -0.4, 0.25, 1.0, 0.02, 0.5},
                                                     {0.05, 0.625, -0.3, -2.0, 0.0, -0.25},
                                                     {0.2, 0.1, 0.1, 0.5, -0.03, 1.0}};
const std::vector<double> kBf16Lrs = {0.1, 0.05, 0.02, 0.01};

// The textbook AdamW (decoupled decay, bias-corrected moments) in double, written independently
// of the implementation; the gradients are rounded to bf16 as the BF16 runs see them.
std::vector<double> reference_adamw_bf16_grads(const AdamWOptions& o, int steps) {
  std::vector<double> p = kBf16P0, m(p.size(), 0.0), v(p.size(), 0.0);
  for (int k = 0; k < steps; ++k) {
    const double lr = kBf16Lrs[size_t(k)];
    const int t = k + 1;
    const double bc1 = 1 - std::pow(o.beta1, t), bc2 = 1 - std::pow(o.beta2, t);
    for (size_t i = 0; i < p.size(); ++i) {
      const double g = bf16_to_f32(f32_to_bf16(float(kBf16Grads[size_t(k)][i])));
      p[i] -= lr * o.weight_decay * p[i];
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g;
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g * g;
      p[i] -= (lr / bc1) * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + o.eps);
    }
  }
  return p;
}

template <class Opt>
Tensor run_steps(Opt& opt, DType dtype, int steps) {
  Tensor p = dtype == DType::BF16 ? bf16_tensor(kBf16P0) : f32_tensor(kBf16P0);
  Tensor g = Tensor::zeros(p.shape(), dtype);
  std::vector<ParamRef> params = {{"layers.0.w", &p, &g}};
  for (int k = 0; k < steps; ++k) {
    // Both dtypes see the same (bf16-representable) gradients, as the reference does.
    Tensor src = bf16_tensor(kBf16Grads[size_t(k)]);
    if (dtype == DType::F32) src = src.to(DType::F32);
    std::memcpy(g.raw(), src.raw(), g.nbytes());
    opt.step(params, kBf16Lrs[size_t(k)]);
  }
  return p;
}

TEST(OptimBf16, AdamWOnBf16ParametersFollowsTheReferenceWithinBf16Precision) {
  AdamWOptions o;
  o.weight_decay = 0.1;
  o.seed = 5;
  const int steps = 4;
  const std::vector<double> ref = reference_adamw_bf16_grads(o, steps);
  for (const DType state : {DType::F32, DType::BF16}) {
    AdamWOptions os = o;
    os.state_dtype = state;
    AdamW fp32_opt(os), bf16_opt(os);
    const Tensor p32 = run_steps(fp32_opt, DType::F32, steps);
    const Tensor p16 = run_steps(bf16_opt, DType::BF16, steps);
    ASSERT_EQ(p16.dtype(), DType::BF16);
    for (size_t i = 0; i < ref.size(); ++i) {
      // fp32 parameters with fp32 state: fp32 precision; bf16 anywhere: bf16's 2^-8 relative
      // per rounding, a few roundings: 2e-2 relative (on at least 0.05, the scale of a step).
      const double tol32 = state == DType::F32 ? 1e-5 : 2e-2;
      EXPECT_NEAR(at(p32, int64_t(i)), ref[i], tol32 * std::max(std::abs(ref[i]), 0.05)) << i;
      EXPECT_NEAR(at(p16, int64_t(i)), ref[i], 2e-2 * std::max(std::abs(ref[i]), 0.05)) << i;
      EXPECT_NEAR(at(p16, int64_t(i)), at(p32, int64_t(i)), 2e-2 * std::max(std::abs(ref[i]), 0.05))
          << i;
    }
    NamedTensors st;
    bf16_opt.save_state(st);
    ASSERT_EQ(st.size(), 3u);
    EXPECT_EQ(st[0].second.dtype(), state);  // exp_avg: fp32 moments for bf16 parameters too
    EXPECT_EQ(st[1].second.dtype(), state);
    EXPECT_EQ(bf16_opt.step_count("layers.0.w"), steps);
  }
}

TEST(OptimBf16, Fp32AdamWIsUnchangedByTheBf16Code) {
  // The F32 path is the same arithmetic as before bf16: AdamW on fp32 gives the element update
  // of adamw_math::Update<float> exactly, with either of torch's lerp formulas (beta1 0.9: the
  // weight 0.1 < 0.5 lerps from m; beta1 0.3: from g).
  for (const double beta1 : {0.9, 0.3}) {
    AdamWOptions o;
    o.beta1 = beta1;
    AdamW opt(o);
    const Tensor p = run_steps(opt, DType::F32, 2);
    std::vector<float> pr(kBf16P0.begin(), kBf16P0.end()), m(kBf16P0.size(), 0),
        v(kBf16P0.size(), 0);
    for (int k = 0; k < 2; ++k) {
      const auto co = [&] {
        const double bc1 = 1 - std::pow(o.beta1, k + 1), bc2 = 1 - std::pow(o.beta2, k + 1);
        return std::vector<double>{1 - kBf16Lrs[size_t(k)] * o.weight_decay,
                                   kBf16Lrs[size_t(k)] / bc1, std::sqrt(bc2)};
      }();
      for (size_t i = 0; i < pr.size(); ++i) {
        const float g = bf16_to_f32(f32_to_bf16(float(kBf16Grads[size_t(k)][i])));  // as run_steps
        const float pi = pr[i] * float(co[0]);
        const float w = float(1 - o.beta1);
        const float mi = w < 0.5f ? m[i] + w * (g - m[i]) : g - (g - m[i]) * (1.0f - w);
        const float vi = v[i] * float(o.beta2) + float(1 - o.beta2) * g * g;
        const float denom = std::sqrt(vi) / float(co[2]) + float(o.eps);
        m[i] = mi;
        v[i] = vi;
        pr[i] = pi + float(-co[1]) * mi / denom;
      }
    }
    for (size_t i = 0; i < pr.size(); ++i)
      EXPECT_EQ(p.data<float>()[i], pr[i]) << beta1 << " " << i;
  }
}

TEST(OptimBf16, ResultsDoNotDependOnTheThreadCount) {
  const int64_t n = 40000;  // above the optimizers' parallel threshold
  std::mt19937 gen(3);
  std::normal_distribution<double> d(0, 1);
  std::vector<double> p0(n), g0(n);
  for (int64_t i = 0; i < n; ++i) {
    p0[size_t(i)] = d(gen);
    g0[size_t(i)] = d(gen) * 1e-2;
  }
  auto run = [&](int threads, int which) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    Tensor p = bf16_tensor(p0), g = bf16_tensor(g0);
    std::vector<ParamRef> params = {{"w", &p, &g}};
    AdamWOptions a;
    a.seed = 8;
    if (which == 1) a.state_dtype = DType::BF16;
    std::unique_ptr<Optimizer> opt;
    if (which <= 1) opt = std::make_unique<AdamW>(a);
    if (which == 2) opt = std::make_unique<AdamW8bit>(AdamW8bitOptions{a, 4096, false});
    if (which == 3) opt = std::make_unique<SGD>(SGDOptions{0.9, 0, 0, false, DType::BF16, 8});
    for (int k = 0; k < 3; ++k) opt->step(params, 1e-3);
    omp_set_num_threads(saved);
    return p;
  };
  for (int which = 0; which < 4; ++which)
    EXPECT_TRUE(same_bits(run(1, which), run(3, which))) << "optimizer " << which;
}

TEST(OptimBf16, AdamW8bitOnBf16ParametersMatchesFp32ParametersWithinBf16Precision) {
  const int64_t n = 5000;  // one 8-bit parameter (>= min_8bit_size 4096)
  std::mt19937 gen(4);
  std::normal_distribution<double> d(0, 1);
  std::vector<double> p0(n), g0(n);
  for (int64_t i = 0; i < n; ++i) {
    p0[size_t(i)] = bf16_to_f32(f32_to_bf16(float(d(gen))));
    g0[size_t(i)] = bf16_to_f32(f32_to_bf16(float(d(gen) * 0.1)));
  }
  AdamW8bitOptions o;
  o.adamw.seed = 2;
  AdamW8bit opt32(o), opt16(o);
  Tensor p32 = f32_tensor(p0), g32 = f32_tensor(g0), p16 = bf16_tensor(p0), g16 = bf16_tensor(g0);
  std::vector<ParamRef> a = {{"w", &p32, &g32}}, b = {{"w", &p16, &g16}};
  for (int k = 0; k < 3; ++k) {
    opt32.step(a, 1e-2);
    opt16.step(b, 1e-2);
  }
  double mean_err = 0;
  for (int64_t i = 0; i < n; ++i) {
    // bf16 rounding of the parameter: at most an ulp (2^-7 relative) per step, three steps.
    EXPECT_NEAR(at(p16, i), at(p32, i), 3 * std::ldexp(std::abs(at(p32, i)), -7) + 1e-3) << i;
    mean_err += (at(p16, i) - at(p32, i)) / double(n);
  }
  EXPECT_LT(std::abs(mean_err), 2e-3);                  // unbiased: the errors average out
  EXPECT_EQ(opt16.state_bytes(), opt32.state_bytes());  // the 8-bit state is the same size
}

// ---- state_dtype ------------------------------------------------------------------------------

TEST(OptimBf16, StateDtypeBf16HalvesAdamWStateAndRoundTrips) {
  const std::vector<double> p0 = {0.5, -1.25, 2.0, 0.0, 0.1, -0.3, 0.7, 1.5};
  const std::vector<double> g0 = {0.3, -0.2, 0.01, 1.5, -0.01, 0.4, 0.2, -0.6};
  for (const DType pd : {DType::F32, DType::BF16}) {
    AdamWOptions o32, o16;
    o16.state_dtype = DType::BF16;
    o16.seed = o32.seed = 11;
    AdamW a32(o32), a16(o16);
    auto fresh = [&](const std::vector<double>& v) {
      return pd == DType::BF16 ? bf16_tensor(v) : f32_tensor(v);
    };
    Tensor p32 = fresh(p0), p16 = fresh(p0), g = fresh(g0);
    std::vector<ParamRef> r32 = {{"w", &p32, &g}}, r16 = {{"w", &p16, &g}};
    a32.step(r32, 0.01);
    a16.step(r16, 0.01);
    EXPECT_EQ(a32.state_bytes(), int64_t(p0.size()) * 8);
    EXPECT_EQ(a16.state_bytes(), int64_t(p0.size()) * 4);  // half
    a16.step(r16, 0.01);

    // Round trip: a restored optimizer continues bit for bit like the original.
    NamedTensors saved;
    a16.save_state(saved);
    ASSERT_EQ(saved.size(), 3u);
    EXPECT_EQ(saved[0].first, "w.exp_avg");
    EXPECT_EQ(saved[0].second.dtype(), DType::BF16);
    EXPECT_EQ(saved[1].second.dtype(), DType::BF16);
    const StateMap state = to_map(saved);
    AdamW restored(o16);
    Tensor pr = p16.clone();
    std::vector<ParamRef> rr = {{"w", &pr, &g}};
    restored.load_state(state, rr);
    EXPECT_EQ(restored.state_bytes(), a16.state_bytes());
    a16.step(r16, 0.01);
    restored.step(rr, 0.01);
    EXPECT_TRUE(same_bits(p16, pr));
    NamedTensors s1, s2;
    a16.save_state(s1);
    restored.save_state(s2);
    for (size_t i = 0; i < 2; ++i) EXPECT_TRUE(same_bits(s1[i].second, s2[i].second)) << i;

    // A state of the other state_dtype is refused, naming the entry and the key.
    NamedTensors saved32;
    a32.save_state(saved32);
    AdamW wrong(o16);
    const std::string e1 = error_of([&] { wrong.load_state(to_map(saved32), rr); });
    EXPECT_NE(e1.find("'w.exp_avg'"), std::string::npos) << e1;
    EXPECT_NE(e1.find("state_dtype"), std::string::npos) << e1;
    AdamW wrong32(o32);
    const std::string e2 = error_of([&] { wrong32.load_state(state, rr); });
    EXPECT_NE(e2.find("is BF16"), std::string::npos) << e2;
    EXPECT_NE(e2.find("state_dtype fp32"), std::string::npos) << e2;
    EXPECT_EQ(wrong32.state_bytes(), 0);  // unchanged on error
  }
  // F64 parameters (gradient checks) have no bf16 state.
  AdamWOptions o16;
  o16.state_dtype = DType::BF16;
  AdamW a(o16);
  Tensor p = Tensor::zeros({2}, DType::F64), g = Tensor::zeros({2}, DType::F64);
  std::vector<ParamRef> r = {{"w", &p, &g}};
  EXPECT_NE(error_of([&] { a.step(r, 0.1); }).find("not F64"), std::string::npos);
  EXPECT_THROW(AdamW(AdamWOptions{0.9, 0.999, 1e-8, 0.0, DType::F16, 0}), Error);
}

// Why the bf16 moments are rounded stochastically: exp_avg_sq shrinks by (1 - beta2) = 0.1% a
// step when the gradient is 0, below bf16's half-ulp (>= 0.2% relative), so round-to-nearest
// would keep it where it is forever. Exact: v_k = 0.001 * 0.999^k after a gradient of 1.
TEST(OptimBf16, Bf16ExpAvgSqDecaysAsInFp32) {
  const int64_t n = 256;
  const int steps = 2000;
  AdamWOptions o;
  o.state_dtype = DType::BF16;
  o.weight_decay = 0;
  AdamW opt(o);
  Tensor p = f32_tensor(std::vector<double>(n, 1.0));
  Tensor g = f32_tensor(std::vector<double>(n, 1.0));
  std::vector<ParamRef> r = {{"w", &p, &g}};
  opt.step(r, 0.0);  // v = (1 - beta2) * 1
  std::memset(g.raw(), 0, g.nbytes());
  for (int k = 0; k < steps; ++k) opt.step(r, 0.0);
  const double expected = (1 - o.beta2) * std::pow(o.beta2, steps);  // 1.35e-4
  NamedTensors st;
  opt.save_state(st);
  const Tensor& v = st[1].second;
  ASSERT_EQ(st[1].first, "w.exp_avg_sq");
  double mean = 0;
  for (int64_t i = 0; i < n; ++i) mean += at(v, i) / double(n);
  EXPECT_NEAR(mean, expected, 0.03 * expected);
  // What round-to-nearest would have kept: the first value, 7x too large.
  uint16_t rn = f32_to_bf16(float(1 - o.beta2));
  for (int k = 0; k < steps; ++k) rn = f32_to_bf16(bf16_to_f32(rn) * float(o.beta2));
  EXPECT_GT(bf16_to_f32(rn), 0.9 * (1 - o.beta2));
}

TEST(OptimBf16, SgdStateDtypeAndStepsRoundTrip) {
  const std::vector<double> p0 = {0.5, -1.25, 2.0, 0.0};
  const std::vector<double> g0 = {0.3, -0.2, 0.01, 1.5};
  SGDOptions o{0.9, 0, 0.01, false, DType::BF16, 3};
  for (const DType pd : {DType::F32, DType::BF16}) {
    SGD a(o);
    Tensor p = pd == DType::BF16 ? bf16_tensor(p0) : f32_tensor(p0);
    Tensor g = pd == DType::BF16 ? bf16_tensor(g0) : f32_tensor(g0);
    std::vector<ParamRef> r = {{"w", &p, &g}};
    a.step(r, 0.1);
    a.step(r, 0.1);
    EXPECT_EQ(a.state_bytes(), int64_t(p0.size()) * 2);  // bf16 buffer
    NamedTensors saved;
    a.save_state(saved);
    ASSERT_EQ(saved.size(), 2u);
    EXPECT_EQ(saved[0].first, "w.momentum_buffer");
    EXPECT_EQ(saved[0].second.dtype(), DType::BF16);
    EXPECT_EQ(saved[1].first, "w.step");  // the stochastic rounding's step, for resumes
    EXPECT_EQ(element_as_double(saved[1].second, 0), 2.0);
    SGD b(o);
    Tensor pb = p.clone();
    std::vector<ParamRef> rb = {{"w", &pb, &g}};
    b.load_state(to_map(saved), rb);
    a.step(r, 0.1);
    b.step(rb, 0.1);
    EXPECT_TRUE(same_bits(p, pb));
    // fp32 state refused by a bf16-state SGD, with the key named.
    SGD f32(SGDOptions{0.9, 0, 0.01, false, DType::F32, 3});
    Tensor pf = p.clone();
    std::vector<ParamRef> rf = {{"w", &pf, &g}};
    f32.step(rf, 0.1);
    NamedTensors s32;
    f32.save_state(s32);
    const std::string e = error_of([&] { b.load_state(to_map(s32), rb); });
    EXPECT_NE(e.find("state_dtype"), std::string::npos) << e;
  }
  // Plain fp32 SGD keeps its state as before: the buffer only, no step.
  SGD plain(SGDOptions{0.9, 0, 0, false, DType::F32, 0});
  Tensor p = f32_tensor(p0), g = f32_tensor(g0);
  std::vector<ParamRef> r = {{"w", &p, &g}};
  plain.step(r, 0.1);
  NamedTensors s;
  plain.save_state(s);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].second.dtype(), DType::F32);
}

TEST(OptimBf16, AdamW8bitRefusesBf16State) {
  AdamW8bitOptions o;
  o.adamw.state_dtype = DType::BF16;
  const std::string e = error_of([&] { AdamW8bit a(o); });
  EXPECT_NE(e.find("state_dtype"), std::string::npos) << e;
  EXPECT_NE(e.find("8 bits"), std::string::npos) << e;
}

TEST(OptimBf16, ParamsNeedBf16GradientsForBf16Values) {
  Tensor p = bf16_tensor({1, 2}), g32 = f32_tensor({1, 2}), g = bf16_tensor({1, 2});
  std::vector<ParamRef> bad = {{"w", &p, &g32}}, good = {{"w", &p, &g}};
  EXPECT_NE(error_of([&] { check_params(bad, "AdamW"); }).find("F32 gradient for a BF16 value"),
            std::string::npos);
  EXPECT_NO_THROW(check_params(good, "AdamW"));
}

// ---- gradient clipping ----------------------------------------------------------------------

TEST(OptimBf16, GradClipOfBf16GradientsMatchesFp32) {
  std::mt19937 gen(6);
  std::normal_distribution<double> d(0, 1);
  std::vector<double> a(10000), b(333);
  for (double& x : a) x = d(gen);
  for (double& x : b) x = 3 * d(gen);
  Tensor pa = bf16_tensor(a), pb = bf16_tensor(b);
  Tensor ga16 = bf16_tensor(a), gb16 = bf16_tensor(b), ga32 = f32_tensor(a), gb32 = f32_tensor(b);
  std::vector<ParamRef> r16 = {{"a", &pa, &ga16}, {"b", &pb, &gb16}};
  Tensor qa = f32_tensor(a), qb = f32_tensor(b);
  std::vector<ParamRef> r32 = {{"a", &qa, &ga32}, {"b", &qb, &gb32}};
  const double n16 = grad_norm(r16), n32 = grad_norm(r32);
  double exact = 0;
  for (double x : a) exact += x * x;
  for (double x : b) exact += x * x;
  exact = std::sqrt(exact);
  // The sum runs in double over the exact widened bf16 values: only the gradients' own bf16
  // rounding (2^-9 relative per element, averaging out) separates it from fp32.
  EXPECT_NEAR(n16, n32, 1e-2 * n32);
  EXPECT_NEAR(n16, exact, 1e-2 * exact);
  const double max_norm = 1.0;
  EXPECT_EQ(clip_grad_norm(r16, max_norm), n16);
  clip_grad_norm(r32, max_norm);
  for (int64_t i = 0; i < int64_t(a.size()); ++i)
    EXPECT_NEAR(at(ga16, i), at(ga32, i), std::ldexp(std::abs(at(ga32, i)), -7) + 1e-9) << i;
  EXPECT_NEAR(grad_norm(r16), max_norm, 1e-2);
  EXPECT_EQ(ga16.dtype(), DType::BF16);
}

// ---- config -----------------------------------------------------------------------------------

Config optimizer_config(const std::string& optimizer, const std::string& top = "") {
  return Config::from_string(
      "output_dir: /tmp/x\nmodel:\n  init: checkpoint\ncheckpointer:\n  checkpoint_dir: /tmp/y\n"
      "tokenizer:\n  _component_: byte\ndataset:\n  _component_: text_completion\n"
      "  source: a.txt\n" +
          top + "optimizer:\n" + optimizer,
      "test.yaml");
}

TEST(OptimBf16, StateDtypeConfigKey) {
  auto problems = [](const std::string& optimizer) {
    return check_config(optimizer_config(optimizer), full_finetune_schema()).errors;
  };
  for (const char* c : {"torch.optim.AdamW", "torch.optim.SGD"})
    for (const char* v : {"fp32", "bf16"}) {
      auto e =
          problems(std::string("  _component_: ") + c + "\n  lr: 1e-3\n  state_dtype: " + v + "\n");
      EXPECT_TRUE(e.empty()) << e[0];
    }
  auto bad = problems("  _component_: torch.optim.AdamW\n  lr: 1e-3\n  state_dtype: fp16\n");
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_NE(bad[0].find("optimizer.state_dtype"), std::string::npos) << bad[0];
  auto eight = problems(
      "  _component_: bitsandbytes.optim.AdamW8bit\n  lr: 1e-3\n"
      "  state_dtype: bf16\n");
  ASSERT_EQ(eight.size(), 1u);
  EXPECT_NE(eight[0].find("state_dtype"), std::string::npos) << eight[0];
  EXPECT_TRUE(problems("  _component_: bitsandbytes.optim.AdamW8bit\n  lr: 1e-3\n"
                       "  state_dtype: fp32\n")
                  .empty());

  // build_optimizer passes seed and state_dtype on.
  auto adamw = build_optimizer(optimizer_config(
      "  _component_: torch.optim.AdamW\n  lr: 1e-3\n  state_dtype: bf16\n", "seed: 77\n"));
  const auto& opts = dynamic_cast<const AdamW&>(*adamw).options();
  EXPECT_EQ(opts.state_dtype, DType::BF16);
  EXPECT_EQ(opts.seed, 77u);
  auto sgd = build_optimizer(optimizer_config(
      "  _component_: torch.optim.SGD\n  lr: 1e-3\n  momentum: 0.9\n  state_dtype: bf16\n"));
  EXPECT_EQ(dynamic_cast<const SGD&>(*sgd).options().state_dtype, DType::BF16);
  EXPECT_THROW(
      build_optimizer(optimizer_config(
          "  _component_: bitsandbytes.optim.AdamW8bit\n  lr: 1e-3\n  state_dtype: bf16\n")),
      Error);

  // What the memory planner is told: state bytes per parameter byte.
  auto ratio = [](const std::string& optimizer, const std::string& top) {
    return optimizer_state_ratio(optimizer_config(optimizer, top)).per_param_byte;
  };
  const std::string adam = "  _component_: torch.optim.AdamW\n  lr: 1e-3\n";
  EXPECT_EQ(ratio(adam, ""), 2.0);
  EXPECT_EQ(ratio(adam + "  state_dtype: bf16\n", ""), 1.0);
  EXPECT_EQ(ratio(adam, "dtype: bf16\n"), 4.0);  // fp32 moments of bf16 parameters
  EXPECT_EQ(ratio(adam + "  state_dtype: bf16\n", "dtype: bf16\n"), 2.0);
  const std::string sgdm = "  _component_: torch.optim.SGD\n  lr: 1e-3\n  momentum: 0.9\n";
  EXPECT_EQ(ratio(sgdm, ""), 1.0);
  EXPECT_EQ(ratio(sgdm + "  state_dtype: bf16\n", ""), 0.5);
  const std::string eightbit = "  _component_: bitsandbytes.optim.AdamW8bit\n  lr: 1e-3\n";
  EXPECT_EQ(ratio(eightbit, "dtype: bf16\n"), 4.0);  // its small parameters: fp32 moments
  EXPECT_EQ(AdamW8bit::state_bytes_for(100, 2, 4096), 800);
  EXPECT_EQ(AdamW8bit::state_bytes_for(100, 4, 4096), 800);
}

}  // namespace
