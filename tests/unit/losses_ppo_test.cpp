// PPO's math (losses/ppo.h, losses/ppo_advantages.h, models/ppo_graph.h) against independent
// formulations written out here in double precision (torchtune's rlhf.get_rewards_ppo,
// estimate_advantages, whiten and PPOLoss as loops), float64 finite differences of both loss
// parts, and the value graph in the three compile modes.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "checks.h"
#include "fusetune/compile/compiler.h"
#include "fusetune/losses/grpo.h"
#include "fusetune/losses/ppo.h"
#include "fusetune/losses/ppo_advantages.h"
#include "fusetune/models/parameters.h"
#include "fusetune/models/ppo_graph.h"
#include "fusetune/recipes/ppo_step.h"
#include "fusetune/runtime/eager_executor.h"
#include "fusetune/util/error.h"
#include "gradcheck.h"
#include "graph_compare.h"
#include "tiny_models.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace {

std::vector<double> ppo_test_random(size_t n, unsigned seed, double lo, double hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = u(rng);
  return v;
}

// torchtune's masked mean (its denominator + 1e-8) and unbiased masked variance, written
// directly.
std::pair<double, double> ppo_mean_var(const std::vector<double>& x, const std::vector<double>& m) {
  double n = 0, s = 0;
  for (size_t i = 0; i < x.size(); ++i)
    if (m[i] != 0) {
      n += 1;
      s += x[i];
    }
  const double mean = s / (n + 1e-8);
  double ss = 0;
  for (size_t i = 0; i < x.size(); ++i)
    if (m[i] != 0) ss += (x[i] - mean) * (x[i] - mean);
  return {mean, ss / (n + 1e-8) * n / (n - 1)};
}

TEST(PpoAdvantages, MaskedWhiteningIsItsFormula) {
  const std::vector<double> x = ppo_test_random(15, 1, -3, 5);
  std::vector<double> m(15, 1.0);
  for (size_t i : {2u, 7u, 8u, 14u}) m[i] = 0;
  const auto [mean, var] = ppo_mean_var(x, m);
  const std::vector<double> w = masked_whiten(x, m);
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_NEAR(w[i], (x[i] - mean) / std::sqrt(var + 1e-8) + mean, 1e-9) << i;
  // Over the mask the result has unit variance (the mean shifted back in).
  const auto [wm, wv] = ppo_mean_var(w, m);
  EXPECT_NEAR(wm, mean, 1e-7);
  EXPECT_NEAR(wv, 1.0, 1e-6);
  EXPECT_TRUE(contains(error_of([] { masked_whiten({1, 2}, {1, 0}); }), "at least 2"));
}

// ppo_full_finetune_distributed: two "ranks" (threads) holding the first 6 and the last 9
// entries whiten with the sums exchanged between them (a stand-in for the all-reduce): each
// half is the whole array's whitening, the mean and variance over both halves' masks.
TEST(PpoAdvantages, WhiteningAcrossRanksIsTheWholeBatchsWhitening) {
  const std::vector<double> x = ppo_test_random(15, 2, -3, 5);
  std::vector<double> m(15, 1.0);
  for (size_t i : {1u, 7u, 8u, 14u}) m[i] = 0;
  const std::vector<double> whole = masked_whiten(x, m);
  // The all-reduce: each thread posts its vector, waits for the other's, and adds it.
  std::vector<double> posted[2];
  std::barrier sync(2);
  auto rank_sum = [&posted, &sync](int rank) {
    return [&posted, &sync, rank](std::vector<double>& v) {
      posted[rank] = v;
      sync.arrive_and_wait();
      for (size_t i = 0; i < v.size(); ++i) v[i] += posted[1 - rank][i];
      sync.arrive_and_wait();  // both have read before either posts again
    };
  };
  std::vector<double> half[2];
  const size_t split = 6;
  auto run = [&](int rank) {
    const auto from = rank == 0 ? 0 : long(split), to = rank == 0 ? long(split) : 15L;
    half[rank] = masked_whiten({x.begin() + from, x.begin() + to},
                               {m.begin() + from, m.begin() + to}, rank_sum(rank));
  };
  std::thread other(run, 1);
  run(0);
  other.join();
  std::vector<double> joined = half[0];
  joined.insert(joined.end(), half[1].begin(), half[1].end());
  ASSERT_EQ(joined.size(), whole.size());
  for (size_t i = 0; i < whole.size(); ++i) EXPECT_NEAR(joined[i], whole[i], 1e-12) << i;
  // Without the exchange each half would be whitened over itself alone.
  EXPECT_GT(
      std::abs(masked_whiten({x.begin(), x.begin() + 6}, {m.begin(), m.begin() + 6})[0] - whole[0]),
      1e-3);
}

TEST(PpoAdvantages, GaeIsADirectReverseLoopAndWhitenedOverTheResponse) {
  const int64_t rows = 3, W = 6;
  const std::vector<double> values = ppo_test_random(rows * W, 2, -1, 1);
  const std::vector<double> rewards = ppo_test_random(rows * W, 3, -2, 2);
  std::vector<double> mask(rows * W, 0.0);
  const int64_t lengths[] = {6, 3, 1};
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t k = 0; k < lengths[i]; ++k) mask[size_t(i * W + k)] = 1;
  for (const auto& [gamma, lmbda] : {std::pair{1.0, 0.95}, std::pair{0.9, 0.5}}) {
    // The recursion from the end: A_t = delta_t + gamma lambda A_{t+1}.
    std::vector<double> adv(rows * W), ret(rows * W);
    for (int64_t i = 0; i < rows; ++i) {
      double next_adv = 0, next_value = 0;
      for (int64_t t = W - 1; t >= 0; --t) {
        const size_t k = size_t(i * W + t);
        const double delta = rewards[k] + gamma * next_value - values[k];
        adv[k] = delta + gamma * lmbda * next_adv;
        ret[k] = adv[k] + values[k];
        next_adv = adv[k];
        next_value = values[k];
      }
    }
    const auto [mean, var] = ppo_mean_var(adv, mask);
    const PpoAdvantages got = ppo_advantages(values, rewards, gamma, lmbda, mask, W);
    for (size_t k = 0; k < adv.size(); ++k) {
      EXPECT_NEAR(got.returns[k], ret[k], 1e-12) << k;
      const double want = mask[k] != 0 ? (adv[k] - mean) / std::sqrt(var + 1e-8) + mean : 0.0;
      EXPECT_NEAR(got.advantages[k], want, 1e-9) << k;
    }
  }
}

TEST(PpoAdvantages, RewardsAreTheKlPenaltyAndTheScoreAtItsIndex) {
  const int64_t W = 4;
  const std::vector<double> lp = {-1, -2, -0.5, 0, -1, -1, 0, 0};
  const std::vector<double> ref = {-1.5, -2, -0.25, 0, -0.5, -2, 0, 0};
  const PpoRewards r = ppo_rewards({2.0, -1.0}, lp, ref, 0.1, {3, 2}, W);
  for (size_t k = 0; k < lp.size(); ++k) {
    EXPECT_DOUBLE_EQ(r.kl[k], lp[k] - ref[k]);
    EXPECT_DOUBLE_EQ(r.kl_reward[k], -0.1 * (lp[k] - ref[k]));
    const double score = k == 3 ? 2.0 : k == 6 ? -1.0 : 0.0;
    EXPECT_DOUBLE_EQ(r.rewards[k], -0.1 * (lp[k] - ref[k]) + score) << k;
  }
  // torchtune's value_seq_idxs: one past the last token when there is room, else the last.
  EXPECT_EQ(ppo_score_index(1, 5), 0);  // a single token: its own index
  EXPECT_EQ(ppo_score_index(2, 5), 2);
  EXPECT_EQ(ppo_score_index(4, 5), 4);
  EXPECT_EQ(ppo_score_index(5, 5), 4);  // full width: the last
  EXPECT_THROW(ppo_score_index(0, 5), Error);
}

// torchtune's PPOLoss written out, for its `padding_masks` m and `value_padding_masks` vm.
struct PpoReference {
  double loss, policy, value;
};
PpoReference ppo_reference(const PpoLoss& l, const std::vector<double>& lp,
                           const std::vector<double>& old, const std::vector<double>& adv,
                           const std::vector<double>& v, const std::vector<double>& old_v,
                           const std::vector<double>& ret, const std::vector<double>& m,
                           const std::vector<double>& vm) {
  double policy = 0, value = 0, n = 0, vn = 0;
  for (size_t i = 0; i < lp.size(); ++i) {
    const double r = std::exp(lp[i] - old[i]);
    const double pl = std::max(-adv[i] * std::clamp(r, 1 - l.epsilon, 1 + l.epsilon), -adv[i] * r);
    policy += pl * m[i];
    n += m[i];
    const double vc =
        std::clamp(v[i], old_v[i] - l.value_clip_range, old_v[i] + l.value_clip_range);
    value += std::max((v[i] - ret[i]) * (v[i] - ret[i]), (vc - ret[i]) * (vc - ret[i])) * vm[i];
    vn += vm[i];
  }
  policy /= n + 1e-8;
  value = 0.5 * value / (vn + 1e-8);
  return {policy + l.value_coeff * value, policy, value};
}

Tensor ppo_f64_tensor(const std::vector<double>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::F64);
  std::copy(v.begin(), v.end(), t.data<double>());
  return t;
}

TEST(PpoLoss, BothPartsMatchPpoLossAndFiniteDifferences) {
  const size_t N = 14;
  const PpoLoss l{0.2, 0.15, 0.3};
  std::vector<double> lp = ppo_test_random(N, 4, -3, -1), old(N), adv(N), m(N, 1.0), vm(N, 1.0);
  const std::vector<double> v = ppo_test_random(N, 5, -1, 1), noise = ppo_test_random(N, 6, -1, 1);
  std::vector<double> old_v(N), ret(N);
  for (size_t i = 0; i < N; ++i) {
    old[i] = lp[i] - std::log(0.5 + 1.2 * double(i) / double(N - 1));  // ratios 0.5 .. 1.7
    adv[i] = i % 2 ? noise[i] + 1.1 : noise[i] - 1.1;
    old_v[i] = v[i] + 0.4 * noise[(i + 3) % N];  // some values outside the clip range
    ret[i] = v[i] + noise[(i + 5) % N];
    if (i % 5 == 4) m[i] = 0;
    if (i % 4 == 3) vm[i] = 0;
  }
  double n = 0, vn = 0;
  for (size_t i = 0; i < N; ++i) {
    n += m[i];
    vn += vm[i];
  }
  std::vector<double> w(N), vw(N);
  for (size_t i = 0; i < N; ++i) {
    w[i] = m[i] / (n + 1e-8);
    vw[i] = vm[i] / (vn + 1e-8);
  }
  const PpoReference want = ppo_reference(l, lp, old, adv, v, old_v, ret, m, vm);
  // The policy part: GRPO's clipped term with beta 0 (what the PPO policy graph builds).
  auto policy_graph = [&](Graph& g) {
    Builder b(g);
    GrpoLossInputs in;
    in.logps = g.param("logps", {int64_t(N)}, true);
    in.old_logps = g.input("old", {int64_t(N)}, DType::F64);
    in.advantages = g.input("adv", {int64_t(N)}, DType::F64);
    in.weights = g.input("w", {int64_t(N)}, DType::F64);
    GrpoLoss gl;
    gl.epsilon = gl.epsilon_high = l.epsilon;
    const Value loss = build_grpo_loss(b, gl, in).loss;
    g.mark_output("loss", loss);
    return loss;
  };
  auto value_graph = [&](Graph& g, bool report) {
    Builder b(g);
    PpoValueLossInputs in;
    in.values = g.param("values", {int64_t(N)}, true);
    in.old_values = g.input("old_v", {int64_t(N)}, DType::F64);
    in.returns = g.input("ret", {int64_t(N)}, DType::F64);
    in.weights = g.input("vw", {int64_t(N)}, DType::F64);
    const PpoValueLossOutputs out = build_ppo_value_loss(b, l, in);
    g.mark_output("loss", out.loss);
    if (report) g.mark_output("value_loss", out.value_loss);
    return out.loss;
  };
  const TensorMap pin{
      {"old", ppo_f64_tensor(old)}, {"adv", ppo_f64_tensor(adv)}, {"w", ppo_f64_tensor(w)}};
  const TensorMap vin{
      {"old_v", ppo_f64_tensor(old_v)}, {"ret", ppo_f64_tensor(ret)}, {"vw", ppo_f64_tensor(vw)}};
  const TensorMap pparams{{"logps", ppo_f64_tensor(lp)}}, vparams{{"values", ppo_f64_tensor(v)}};
  Graph pg(DType::F64), vg(DType::F64);
  policy_graph(pg);
  value_graph(vg, true);
  const double policy = EagerExecutor(pg).run(pin, pparams)[0].data<double>()[0];
  const std::vector<Tensor> vout = EagerExecutor(vg).run(vin, vparams);
  EXPECT_NEAR(policy, want.policy, 1e-12);
  EXPECT_NEAR(vout[1].data<double>()[0], want.value, 1e-12);
  EXPECT_NEAR(policy + vout[0].data<double>()[0], want.loss, 1e-12);
  // Both clip sides are exercised.
  int clipped = 0, value_clipped = 0;
  for (size_t i = 0; i < N; ++i) {
    clipped += m[i] != 0 && l.clipped(std::exp(lp[i] - old[i]), adv[i]);
    value_clipped += vm[i] != 0 && std::abs(v[i] - old_v[i]) > l.value_clip_range;
  }
  EXPECT_GT(clipped, 0);
  EXPECT_GT(value_clipped, 0);
  Graph pg2(DType::F64), vg2(DType::F64);
  const Value pl = policy_graph(pg2);
  check_gradients(pg2, pl, pparams, pin, int(N), 1e-7);
  const Value vl = value_graph(vg2, false);
  check_gradients(vg2, vl, vparams, vin, int(N), 1e-7);
}

// The value model's graphs on a tiny classifier: the forward-only values are the training
// graph's (so the first update starts from the rollout's values) in each compile mode, and the
// modes agree.
TEST(PpoValueGraph, RolloutValuesAreTheTrainingGraphsAndCompileModesAgree) {
  ModelConfig cfg = tiny_config(false, false);
  cfg.num_labels = 1;
  const int64_t rows = 3, T = 8, N = rows * T;
  TrainingGraphOptions o;
  o.batch_size = rows;
  o.seq_len = T;
  o.loss = ppo_value_loss_builder(PpoLoss{0.2, 0.2, 0.1});
  TrainingGraph tg = build_training_graph(cfg, o);
  const Graph fwd = build_token_values_graph(cfg, rows, T, DType::F32);
  TensorMap params = init_parameters(graph_parameters(tg.graph), 7, DType::F32, 0.3);
  const Batch b = random_batch(rows, T, cfg.vocab_size, 3);
  TensorMap in = batch_inputs(b, DType::F32, 1.0);
  Tensor ret = Tensor::empty({N}, DType::F32), w = Tensor::empty({N}, DType::F32);
  for (int64_t i = 0; i < N; ++i) {
    ret.data<float>()[i] = float(std::sin(double(i)));
    w.data<float>()[i] = i % 3 ? 1.0f / float(N) : 0.0f;
  }
  in["returns"] = ret;
  in["value_weights"] = w;
  std::vector<std::vector<Tensor>> outs;
  for (CompileMode mode : {CompileMode::None, CompileMode::Model, CompileMode::Full}) {
    PassOptions po;
    po.mode = mode;
    const Tensor old = compile_graph(fwd, po).executor->run(in, params)[0];
    in["old_values"] = old;
    outs.push_back(compile_graph(tg.graph, po).executor->run(in, params));
    const auto& names = tg.graph.outputs();
    for (size_t k = 0; k < names.size(); ++k)
      if (names[k].first == "report:values") {
        EXPECT_EQ(max_rel_diff(outs.back()[k], old), 0.0) << "mode " << int(mode);
      }
  }
  for (size_t m = 1; m < outs.size(); ++m)
    for (size_t k = 0; k < outs[0].size(); ++k)
      EXPECT_LT(max_rel_diff(outs[m][k], outs[0][k]), 1e-4)
          << "mode " << m << " output " << tg.graph.outputs()[k].first;
}

}  // namespace
