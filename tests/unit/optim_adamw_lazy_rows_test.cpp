// AdamW's lazy rows (optim/adamw.cpp): rows whose gradient and moments are all zero are not
// read, yet every parameter and moment ends bitwise as the dense update leaves it. The dense
// update is written out here, element by element over every row (as AdamW did before lazy
// rows), for each storage combination, with and without weight decay, over steps where some
// rows are touched once and then decay, and across a save/load of the state.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "fusetune/optim/adamw.h"
#include "fusetune/optim/adamw_math.h"
#include "fusetune/optim/stochastic_rounding.h"

using namespace fusetune;

namespace {

constexpr int64_t kRows = 48, kCols = 8;

// The dense reference: every element of every row, as torch.optim.AdamW.
template <class T, class P, class M>
void dense_adamw(P* p, const P* g, M* m, M* v, int64_t n, const AdamWOptions& o, double lr,
                 int64_t step, const std::string& name) {
  const adamw_math::Update<T> update(adamw_math::coefficients(o, lr, step));
  const bf16::Stream r(o.seed, step, name);
  for (int64_t i = 0; i < n; ++i) {
    T pi = bf16::load(p[i]), mi = bf16::load(m[i]), vi = bf16::load(v[i]);
    update(pi, bf16::load(g[i]), mi, vi);
    bf16::store(m[i], mi, r, bf16::Buffer::ExpAvg, i);
    bf16::store(v[i], vi, r, bf16::Buffer::ExpAvgSq, i);
    bf16::store(p[i], pi, r, bf16::Buffer::Value, i);
  }
}

// Step s's gradient: rows 0-3 at step 0 only (then their moments decay), every fifth row at
// every step, the rest never (an embedding's untouched vocabulary); one touched row all -0.
template <class P>
Tensor sparse_gradient(int step, DType dt) {
  Tensor g = Tensor::zeros({kRows, kCols}, dt);
  std::mt19937 rng(uint32_t(step) + 1);
  std::normal_distribution<float> nd(0, 1e-2f);
  for (int64_t row = 0; row < kRows; ++row) {
    const bool touched = (step == 0 && row < 4) || row % 5 == 0;
    for (int64_t c = 0; touched && c < kCols; ++c) {
      const float x = row == 10 ? -0.0f : nd(rng);
      if constexpr (sizeof(P) == 2)
        g.data<uint16_t>()[row * kCols + c] = f32_to_bf16(x);
      else
        g.data<P>()[row * kCols + c] = P(x);
    }
  }
  return g;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

template <class T, class P, class M>
void check_lazy_rows_match_dense(DType pd, DType md, double weight_decay) {
  SCOPED_TRACE(std::string(dtype_name(pd)) + " parameters, " + dtype_name(md) +
               " moments, weight_decay " + std::to_string(weight_decay));
  AdamWOptions o;
  o.weight_decay = weight_decay;
  o.state_dtype = md == DType::BF16 ? DType::BF16 : DType::F32;
  o.seed = 7;
  Tensor value = Tensor::empty({kRows, kCols}, pd);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0, 1);
  for (int64_t i = 0; i < value.numel(); ++i) {
    if constexpr (sizeof(P) == 2)
      value.data<uint16_t>()[i] = f32_to_bf16(nd(rng));
    else
      value.data<P>()[i] = P(nd(rng));
  }
  Tensor ref = value.clone(), m = Tensor::zeros(value.shape(), md),
         v = Tensor::zeros(value.shape(), md);
  auto lazy = std::make_unique<AdamW>(o);
  const double lr = 1e-2;
  for (int s = 0; s < 6; ++s) {
    Tensor g = sparse_gradient<P>(s, pd);
    if (s == 3) {  // resume: the active rows are recovered from the loaded moments
      NamedTensors saved;
      lazy->save_state(saved);
      StateMap state;
      for (auto& [name, t] : saved) state[name] = t;
      lazy = std::make_unique<AdamW>(o);
      Tensor gv = g;
      lazy->load_state(state, {{"w", &value, &gv}});
    }
    lazy->step({{"w", &value, &g}}, lr);
    dense_adamw<T>(ref.data<P>(), g.data<P>(), m.data<M>(), v.data<M>(), ref.numel(), o, lr, s + 1,
                   "w");
    ASSERT_TRUE(same_bits(value, ref)) << "parameter differs after step " << s + 1;
  }
  NamedTensors saved;
  lazy->save_state(saved);
  StateMap state;
  for (auto& [name, t] : saved) state[name] = t;
  EXPECT_TRUE(same_bits(state.at("w.exp_avg"), m));
  EXPECT_TRUE(same_bits(state.at("w.exp_avg_sq"), v));
}

}  // namespace

TEST(AdamWLazyRows, Fp32MatchesTheDenseUpdateBitwise) {
  for (double wd : {0.0, 0.01})
    check_lazy_rows_match_dense<float, float, float>(DType::F32, DType::F32, wd);
}

TEST(AdamWLazyRows, Bf16ParametersAndMomentsMatchTheDenseUpdateBitwise) {
  for (double wd : {0.0, 0.01}) {
    check_lazy_rows_match_dense<float, uint16_t, float>(DType::BF16, DType::F32, wd);
    check_lazy_rows_match_dense<float, uint16_t, uint16_t>(DType::BF16, DType::BF16, wd);
    check_lazy_rows_match_dense<float, float, uint16_t>(DType::F32, DType::BF16, wd);
  }
}

TEST(AdamWLazyRows, F64MatchesTheDenseUpdateBitwise) {
  for (double wd : {0.0, 0.01})
    check_lazy_rows_match_dense<double, double, double>(DType::F64, DType::F64, wd);
}
