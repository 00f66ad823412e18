#include "fusetune/losses/ppo_advantages.h"

#include <cmath>

#include "fusetune/util/error.h"

namespace fusetune {
namespace {

// The masked sum of x and the mask's count, summed over the ranks when sum_over_ranks is set.
std::vector<double> ppo_masked_sums(const std::vector<double>& x, const std::vector<double>& mask,
                                    const PpoRankSum& sum_over_ranks) {
  std::vector<double> s = {0, 0};
  for (size_t i = 0; i < x.size(); ++i) {
    s[0] += x[i] * mask[i];
    s[1] += mask[i];
  }
  if (sum_over_ranks) sum_over_ranks(s);
  return s;
}

}  // namespace

PpoRewards ppo_rewards(const std::vector<double>& scores, const std::vector<double>& logps,
                       const std::vector<double>& ref_logps, double kl_coeff,
                       const std::vector<int64_t>& score_index, int64_t W) {
  const size_t rows = scores.size();
  FT_CHECK(logps.size() == rows * size_t(W) && ref_logps.size() == logps.size() &&
               score_index.size() == rows,
           "ppo_rewards: inconsistent sizes");
  PpoRewards r;
  r.kl.resize(logps.size());
  r.kl_reward.resize(logps.size());
  for (size_t i = 0; i < logps.size(); ++i) {
    r.kl[i] = logps[i] - ref_logps[i];
    r.kl_reward[i] = -kl_coeff * r.kl[i];
  }
  r.rewards = r.kl_reward;
  for (size_t i = 0; i < rows; ++i) {
    FT_CHECK(score_index[i] >= 0 && score_index[i] < W, "ppo_rewards: score index out of range");
    r.rewards[i * size_t(W) + size_t(score_index[i])] += scores[i];
  }
  return r;
}

PpoAdvantages ppo_advantages(const std::vector<double>& values, const std::vector<double>& rewards,
                             double gamma, double lmbda, const std::vector<double>& mask, int64_t W,
                             const PpoRankSum& sum_over_ranks) {
  FT_CHECK(W >= 1 && values.size() % size_t(W) == 0 && rewards.size() == values.size() &&
               mask.size() == values.size(),
           "ppo_advantages: inconsistent sizes");
  const int64_t rows = int64_t(values.size()) / W;
  std::vector<double> adv(values.size());
  for (int64_t i = 0; i < rows; ++i) {
    double last = 0;
    for (int64_t t = W - 1; t >= 0; --t) {
      const size_t k = size_t(i * W + t);
      const double next = t + 1 < W ? values[k + 1] : 0.0;
      last = rewards[k] + gamma * next - values[k] + gamma * lmbda * last;
      adv[k] = last;
    }
  }
  PpoAdvantages out;
  out.returns.resize(values.size());
  for (size_t k = 0; k < values.size(); ++k) out.returns[k] = adv[k] + values[k];
  out.advantages = masked_whiten(adv, mask, sum_over_ranks);
  for (size_t k = 0; k < values.size(); ++k)
    if (mask[k] == 0) out.advantages[k] = 0;
  return out;
}

std::vector<double> masked_whiten(const std::vector<double>& x, const std::vector<double>& mask,
                                  const PpoRankSum& sum_over_ranks) {
  FT_CHECK(x.size() == mask.size(), "masked_whiten: inconsistent sizes");
  const std::vector<double> sums = ppo_masked_sums(x, mask, sum_over_ranks);
  const double n = sums[1];
  FT_CHECK(n >= 2, "PPO whitens the advantages over the response tokens, and this rollout has " +
                       std::to_string(int64_t(n)) +
                       " (give batch_size or max_generated_tokens room for at least 2)");
  const double mean = sums[0] / (n + 1e-8);
  std::vector<double> sq(x.size());
  for (size_t i = 0; i < x.size(); ++i) sq[i] = (x[i] - mean) * (x[i] - mean);
  const double sq_sum = ppo_masked_sums(sq, mask, sum_over_ranks)[0];
  const double var = sq_sum / (n + 1e-8) * n / (n - 1);  // Bessel's correction
  const double inv = 1.0 / std::sqrt(var + 1e-8);
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = (x[i] - mean) * inv + mean;
  return out;
}

}  // namespace fusetune
