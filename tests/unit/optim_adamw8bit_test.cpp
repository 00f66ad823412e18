// 8-bit AdamW (optim/adamw8bit.h): the quantization maps and block-wise quantization against
// references written here from bitsandbytes' documented algorithm, one step against a float64
// reference that quantizes the same way, exact resume of the state, the state's size (a
// quarter of fp32 AdamW's, measured by the memory counters), and the memory estimate.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "fusetune/compile/memory_estimate.h"
#include "fusetune/core/memory.h"
#include "fusetune/kernels/cpu/nf4.h"
#include "fusetune/optim/adamw.h"
#include "fusetune/optim/adamw8bit.h"
#include "fusetune/util/error.h"

using namespace fusetune;

namespace {

// torch.linspace(start, end, steps) in float32, as torch's CPU kernel computes it: the first
// half counted up from start, the second half down from end.
std::vector<float> linspace_f32(float start, float end, int steps) {
  std::vector<float> out(static_cast<size_t>(steps));
  const float step = (end - start) / float(steps - 1);
  const int half = steps / 2;
  for (int i = 0; i < steps; ++i)
    out[size_t(i)] = i < half ? start + step * float(i) : end - step * float(steps - i - 1);
  return out;
}

// bitsandbytes' create_dynamic_map(signed, max_exponent_bits=7, total_bits=8), written out
// from its documented algorithm: non_sign_bits = total_bits - 1 = 7; for each exponent bit
// pattern i < max_exponent_bits, fraction_items = 2^(i + non_sign_bits - max_exponent_bits) + 1
// (signed) or 2^(i + non_sign_bits - max_exponent_bits + 1) + 1 (unsigned); the means of
// neighbouring linspace(0.1, 1, fraction_items) boundaries times 10^(-(max_exponent_bits - 1)
// + i), negated too when signed; additional_items = 2^(non_sign_bits - max_exponent_bits) - 1
// = 0; then 0 and 1.0 are appended and the list is sorted (float32 throughout, as torch).
std::vector<float> reference_dynamic_map(bool is_signed) {
  const int max_exponent_bits = 7, total_bits = 8, non_sign_bits = total_bits - 1;
  std::vector<float> data;
  for (int i = 0; i < max_exponent_bits; ++i) {
    const int fraction_items = is_signed ? (1 << (i + non_sign_bits - max_exponent_bits)) + 1
                                         : (1 << (i + non_sign_bits - max_exponent_bits + 1)) + 1;
    const std::vector<float> b = linspace_f32(0.1f, 1.0f, fraction_items);
    const float scale = float(std::pow(10.0, double(-(max_exponent_bits - 1) + i)));
    for (size_t k = 0; k + 1 < b.size(); ++k) {
      const float mean = (b[k] + b[k + 1]) / 2.0f;
      data.push_back(scale * mean);
      if (is_signed) data.push_back(-scale * mean);
    }
  }
  EXPECT_EQ((1 << (non_sign_bits - max_exponent_bits)) - 1, 0);  // no additional items
  data.push_back(0.0f);
  data.push_back(1.0f);
  EXPECT_EQ(data.size(), 256u);
  std::sort(data.begin(), data.end());
  return data;
}

// The nearest map value by linear scan (the first of equals), as bitsandbytes' reference
// quantize_blockwise (argmin of |x / absmax - code|) does.
int argmin_code(const float* map, float v) {
  int best = 0;
  for (int j = 1; j < 256; ++j)
    if (std::abs(v - map[j]) < std::abs(v - map[best])) best = j;
  return best;
}

std::vector<float> random_values(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    x[size_t(i)] = normal(rng) * std::pow(10.0f, float(int(i / 700) % 5) - 3.0f);
  return x;
}

const uint8_t* bytes_of(const Tensor& t) { return reinterpret_cast<const uint8_t*>(t.raw()); }

}  // namespace

TEST(AdamW8bitQuant, MapsMatchCreateDynamicMap) {
  for (bool is_signed : {true, false}) {
    const std::vector<float> ref = reference_dynamic_map(is_signed);
    const float* map = q8::dynamic_map(is_signed);
    for (int j = 0; j < 256; ++j) {
      // The implementation computes the means in double and rounds once: at most an ulp or
      // two from torch's float32 arithmetic.
      EXPECT_NEAR(map[j], ref[size_t(j)], 3e-7f * std::max(1e-6f, std::abs(ref[size_t(j)])))
          << (is_signed ? "signed" : "unsigned") << " code " << j;
      if (j > 0) {
        EXPECT_LT(map[j - 1], map[j]) << "ascending, distinct";
      }
    }
    EXPECT_EQ(map[255], 1.0f);
  }
  const float* s = q8::dynamic_map(true);
  const float* u = q8::dynamic_map(false);
  EXPECT_EQ(s[127], 0.0f);  // 127 negative values, 0, 127 positive values up to 1
  EXPECT_NEAR(s[0], -0.99297f, 1e-5f);
  EXPECT_EQ(u[0], 0.0f);
  EXPECT_NEAR(u[1], 1e-6f * (0.1f + 0.45f / 2), 1e-12f);  // i = 0: two fraction values
  // The signed map is the one the NF4 double quantization uses.
  for (int j = 0; j < 256; ++j) EXPECT_EQ(s[j], kernels::nf4_dynamic_map()[j]);
}

TEST(AdamW8bitQuant, BlockwiseQuantizationMatchesReference) {
  const int64_t n = 2 * q8::kBlock + 1234;  // a partial last block
  std::vector<float> x = random_values(n, 7);
  for (int64_t i = q8::kBlock; i < 2 * q8::kBlock; ++i) x[size_t(i)] = 0.0f;  // a zero block
  for (bool is_signed : {true, false}) {
    std::vector<float> in = x;
    if (!is_signed)
      for (float& v : in) v = v * v;
    const float* map = q8::dynamic_map(is_signed);
    std::vector<uint8_t> codes(static_cast<size_t>(n));
    std::vector<float> absmax(3);
    q8::quantize_blockwise(in.data(), n, map, q8::kBlock, codes.data(), absmax.data());
    std::vector<float> out(static_cast<size_t>(n));
    q8::dequantize_blockwise(codes.data(), absmax.data(), n, map, q8::kBlock, out.data());
    const int zero = argmin_code(map, 0.0f);
    for (int64_t b = 0; b < 3; ++b) {
      const int64_t i0 = b * q8::kBlock, i1 = std::min(n, i0 + q8::kBlock);
      float am = 0;
      for (int64_t i = i0; i < i1; ++i) am = std::max(am, std::abs(in[size_t(i)]));
      ASSERT_EQ(absmax[size_t(b)], am);
      for (int64_t i = i0; i < i1; ++i) {
        const int want = am > 0 ? argmin_code(map, in[size_t(i)] / am) : zero;
        ASSERT_EQ(int(codes[size_t(i)]), want) << "element " << i;
        ASSERT_EQ(out[size_t(i)], map[want] * am);
        // Within half the widest gap of the map (relative to the block's absmax).
        ASSERT_LE(std::abs(out[size_t(i)] - in[size_t(i)]), 0.5f * 0.0625f * am + 1e-30f);
      }
    }
  }
}

namespace {

// One step of the 8-bit AdamW in float64: the state dequantized from the optimizer's own
// codes, AdamW's textbook update, requantized the same way (absmax = max |m|, max v per
// 2048-block, stored as float; nearest map value of m / absmax).
struct RefState {
  std::vector<uint8_t> c1, c2;
  std::vector<float> a1, a2;
};

void reference_step(std::vector<double>& p, const std::vector<double>& g, RefState& s, int step,
                    double lr, const AdamWOptions& o) {
  const int64_t n = int64_t(p.size());
  const float* map1 = q8::dynamic_map(true);
  const float* map2 = q8::dynamic_map(false);
  const double bc1 = 1 - std::pow(o.beta1, step), bc2 = 1 - std::pow(o.beta2, step);
  std::vector<double> m(static_cast<size_t>(n)), v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t b = i / q8::kBlock;
    const double m0 = double(map1[s.c1[size_t(i)]]) * double(s.a1[size_t(b)]);
    const double v0 = double(map2[s.c2[size_t(i)]]) * double(s.a2[size_t(b)]);
    const double gi = g[size_t(i)];
    p[size_t(i)] *= 1 - lr * o.weight_decay;
    m[size_t(i)] = o.beta1 * m0 + (1 - o.beta1) * gi;
    v[size_t(i)] = o.beta2 * v0 + (1 - o.beta2) * gi * gi;
    p[size_t(i)] -= (lr / bc1) * m[size_t(i)] / (std::sqrt(v[size_t(i)] / bc2) + o.eps);
  }
  for (int64_t b = 0; b * q8::kBlock < n; ++b) {
    const int64_t i0 = b * q8::kBlock, i1 = std::min(n, i0 + q8::kBlock);
    double am1 = 0, am2 = 0;
    for (int64_t i = i0; i < i1; ++i) {
      am1 = std::max(am1, std::abs(m[size_t(i)]));
      am2 = std::max(am2, v[size_t(i)]);
    }
    s.a1[size_t(b)] = float(am1);
    s.a2[size_t(b)] = float(am2);
    for (int64_t i = i0; i < i1; ++i) {
      s.c1[size_t(i)] =
          uint8_t(am1 > 0 ? argmin_code(map1, float(m[size_t(i)] / double(s.a1[size_t(b)]))) : 127);
      s.c2[size_t(i)] =
          uint8_t(am2 > 0 ? argmin_code(map2, float(v[size_t(i)] / double(s.a2[size_t(b)]))) : 0);
    }
  }
}

template <class T>
void check_step_against_reference() {
  const int64_t n = 5000;  // 8-bit (>= 4096), blocks of 2048, 2048 and 904
  AdamW8bitOptions o;
  o.adamw.weight_decay = 0.1;
  AdamW8bit opt(o);
  Tensor p = Tensor::empty({50, 100}, dtype_of<T>());
  Tensor g = Tensor::empty({50, 100}, dtype_of<T>());
  const std::vector<float> p0 = random_values(n, 1);
  for (int64_t i = 0; i < n; ++i) p.data<T>()[i] = T(p0[size_t(i)]);
  std::vector<ParamRef> refs = {{"w", &p, &g}};
  const double lrs[] = {1e-2, 5e-3, 2e-3, 1e-3};
  for (int k = 0; k < 4; ++k) {
    const std::vector<float> gk = random_values(n, uint64_t(100 + k));
    for (int64_t i = 0; i < n; ++i) g.data<T>()[i] = T(gk[size_t(i)]);
    // The reference starts from the optimizer's state before this step.
    NamedTensors before;
    opt.save_state(before);
    RefState s{std::vector<uint8_t>(size_t(n), 127), std::vector<uint8_t>(size_t(n), 0),
               std::vector<float>(3, 0.0f), std::vector<float>(3, 0.0f)};
    for (const auto& [name, t] : before) {
      if (name == "w.state1") std::memcpy(s.c1.data(), bytes_of(t), size_t(n));
      if (name == "w.state2") std::memcpy(s.c2.data(), bytes_of(t), size_t(n));
      if (name == "w.absmax1") std::memcpy(s.a1.data(), t.raw(), 12);
      if (name == "w.absmax2") std::memcpy(s.a2.data(), t.raw(), 12);
    }
    std::vector<double> rp(static_cast<size_t>(n)), rg(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      rp[size_t(i)] = double(p.data<T>()[i]);
      rg[size_t(i)] = double(g.data<T>()[i]);
    }
    reference_step(rp, rg, s, k + 1, lrs[k], o.adamw);
    opt.step(refs, lrs[k]);
    EXPECT_EQ(opt.step_count("w"), k + 1);

    NamedTensors after;
    opt.save_state(after);
    ASSERT_EQ(after.size(), 5u);  // absmax1, absmax2, state1, state2, step
    int flips = 0;
    for (const auto& [name, t] : after) {
      const bool first = name == "w.state1" || name == "w.absmax1";
      if (name == "w.state1" || name == "w.state2") {
        const std::vector<uint8_t>& want = first ? s.c1 : s.c2;
        for (int64_t i = 0; i < n; ++i) {
          const int d = int(bytes_of(t)[i]) - int(want[size_t(i)]);
          ASSERT_LE(std::abs(d), 1) << name << " element " << i;
          flips += d != 0;  // an fp32 rounding on a midpoint between two codes
        }
      } else if (name == "w.absmax1" || name == "w.absmax2") {
        const std::vector<float>& want = first ? s.a1 : s.a2;
        for (int b = 0; b < 3; ++b)
          EXPECT_NEAR(t.template data<float>()[b], want[size_t(b)], 1e-6 * want[size_t(b)]) << name;
      }
    }
    EXPECT_LE(flips, n / 1000) << "step " << k + 1;
    for (int64_t i = 0; i < n; ++i)
      ASSERT_NEAR(double(p.data<T>()[i]), rp[size_t(i)], 2e-6 * (1 + std::abs(rp[size_t(i)])))
          << "step " << k + 1 << " element " << i;
  }
}

}  // namespace

TEST(AdamW8bit, StepMatchesFloat64Reference) { check_step_against_reference<float>(); }
TEST(AdamW8bit, StepMatchesFloat64ReferenceF64Params) { check_step_against_reference<double>(); }

TEST(AdamW8bit, SmallParametersAreExactlyAdamW) {
  // Below min_8bit_size the state is fp32 AdamW's: bit-identical parameters and entries.
  AdamW8bit q;
  AdamW a;
  Tensor p1 = Tensor::empty({64}, DType::F32), p2 = Tensor::empty({64}, DType::F32);
  Tensor g = Tensor::empty({64}, DType::F32);
  const std::vector<float> x = random_values(64, 3);
  std::memcpy(p1.raw(), x.data(), 256);
  std::memcpy(p2.raw(), x.data(), 256);
  for (int k = 0; k < 3; ++k) {
    const std::vector<float> gk = random_values(64, uint64_t(10 + k));
    std::memcpy(g.raw(), gk.data(), 256);
    q.step({{"n", &p1, &g}}, 1e-2);
    a.step({{"n", &p2, &g}}, 1e-2);
  }
  EXPECT_EQ(std::memcmp(p1.raw(), p2.raw(), 256), 0);
  NamedTensors sq, sa;
  q.save_state(sq);
  a.save_state(sa);
  ASSERT_EQ(sq.size(), sa.size());
  for (size_t i = 0; i < sq.size(); ++i) {
    EXPECT_EQ(sq[i].first, sa[i].first);
    EXPECT_EQ(std::memcmp(sq[i].second.raw(), sa[i].second.raw(), sq[i].second.nbytes()), 0);
  }
}

TEST(AdamW8bit, ResumeIsExact) {
  // Two parameters: one 8-bit, one small (fp32 state). A copy of the state after 3 steps,
  // loaded into a new optimizer, continues bit for bit.
  auto init = [](Tensor& big, Tensor& small) {
    big = Tensor::empty({4096 + 77}, DType::F32);
    small = Tensor::empty({33}, DType::F32);
    const std::vector<float> a = random_values(big.numel(), 5), b = random_values(33, 6);
    std::memcpy(big.raw(), a.data(), big.nbytes());
    std::memcpy(small.raw(), b.data(), small.nbytes());
  };
  Tensor b1, s1, b2, s2, gb = Tensor::empty({4096 + 77}, DType::F32),
                         gs = Tensor::empty({33}, DType::F32);
  init(b1, s1);
  AdamW8bit first;
  auto grads = [&](int k) {
    const std::vector<float> x = random_values(gb.numel(), uint64_t(50 + k));
    const std::vector<float> y = random_values(33, uint64_t(80 + k));
    std::memcpy(gb.raw(), x.data(), gb.nbytes());
    std::memcpy(gs.raw(), y.data(), gs.nbytes());
  };
  std::vector<ParamRef> r1 = {{"big", &b1, &gb}, {"small", &s1, &gs}};
  for (int k = 0; k < 3; ++k) {
    grads(k);
    first.step(r1, 1e-2);
  }
  NamedTensors saved;
  first.save_state(saved);
  StateMap copy;
  for (const auto& [name, t] : saved) copy[name] = t.clone();
  b2 = b1.clone();
  s2 = s1.clone();
  AdamW8bit second;
  std::vector<ParamRef> r2 = {{"big", &b2, &gb}, {"small", &s2, &gs}};
  second.load_state(copy, r2);
  EXPECT_EQ(second.step_count("big"), 3);
  EXPECT_EQ(second.step_count("small"), 3);
  EXPECT_EQ(second.state_bytes(), first.state_bytes());
  for (int k = 3; k < 6; ++k) {
    grads(k);
    first.step(r1, 1e-2);
    second.step(r2, 1e-2);
  }
  EXPECT_EQ(std::memcmp(b1.raw(), b2.raw(), b1.nbytes()), 0);
  EXPECT_EQ(std::memcmp(s1.raw(), s2.raw(), s1.nbytes()), 0);
  NamedTensors x, y;
  first.save_state(x);
  second.save_state(y);
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(x[i].first, y[i].first);
    EXPECT_EQ(std::memcmp(x[i].second.raw(), y[i].second.raw(), x[i].second.nbytes()), 0)
        << x[i].first;
  }

  // fp32 AdamW state is refused, naming the missing entry; a failed load changes nothing.
  AdamW plain;
  plain.step(r1, 1e-2);
  NamedTensors ps;
  plain.save_state(ps);
  StateMap pm;
  for (const auto& [name, t] : ps) pm[name] = t;
  try {
    second.load_state(pm, r2);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("big.absmax1"), std::string::npos) << e.what();
  }
  EXPECT_EQ(second.step_count("big"), 6);
}

TEST(AdamW8bit, StateIsAQuarterOfAdamWMeasuredByTheCounters) {
  // Lazily allocated on the first step, in counted memory.
  const std::vector<Shape> shapes = {{512, 64}, {64, 64}, {172, 64}, {64}, {64}};
  std::vector<Tensor> ps, gs;
  for (const Shape& s : shapes) {
    ps.push_back(Tensor::zeros(s, DType::F32));
    gs.push_back(Tensor::zeros(s, DType::F32));
    gs.back().data<float>()[0] = 1.0f;
  }
  std::vector<ParamRef> refs;
  for (size_t i = 0; i < shapes.size(); ++i)
    refs.push_back({"p" + std::to_string(i), &ps[i], &gs[i]});
  auto measure = [&](Optimizer& opt) {
    const int64_t before = memory::current_bytes();
    opt.step(refs, 1e-3);
    const int64_t grown = memory::current_bytes() - before;
    EXPECT_EQ(grown, opt.state_bytes());
    return grown;
  };
  AdamW a;
  AdamW8bitOptions o;
  o.min_8bit_size = 1;  // everything 8-bit: the pure ratio
  AdamW8bit q(o);
  const int64_t fp32 = measure(a), eight = measure(q);
  int64_t numel = 0;
  for (const Shape& s : shapes) numel += shape_numel(s);
  EXPECT_EQ(fp32, 8 * numel);
  // 2 bytes per element + 2 fp32 absmax per block (and up to 3 padding bytes per code tensor).
  EXPECT_NEAR(double(eight) / double(fp32), 0.25, 0.01);
  std::printf("optimizer state: AdamW %lld bytes, AdamW8bit %lld bytes (%.4f)\n", (long long)fp32,
              (long long)eight, double(eight) / double(fp32));

  // The memory estimate predicts the same bytes, small parameters (fp32 state) included.
  AdamW8bit dflt;  // min_8bit_size 4096: the three matrices 8-bit, the vectors fp32
  const int64_t measured = measure(dflt);
  OptimizerStateSize est(2.0);
  est.min_8bit_numel = 4096;
  int64_t predicted = 0;
  for (const Shape& s : shapes) predicted += est.bytes(shape_numel(s), 4 * shape_numel(s));
  EXPECT_EQ(predicted, measured);
  EXPECT_EQ(OptimizerStateSize(2.0).bytes(100, 400), 800);
}

TEST(AdamW8bit, RejectsBadOptions) {
  AdamW8bitOptions o;
  o.min_8bit_size = 0;
  EXPECT_THROW(AdamW8bit{o}, Error);
  o.min_8bit_size = 4096;
  o.adamw.beta1 = 1.5;
  EXPECT_THROW(AdamW8bit{o}, Error);
}
