#pragma once
// PPO's rewards and advantages over a rollout (torchtune's rlhf.get_rewards_ppo,
// estimate_advantages and whiten; docs/design.md §11), in double precision on the host. Every
// array is [rows * W], row-major, W the response width (max_generated_tokens): entry (i, k)
// belongs to row i's k-th response token.
#include <cstdint>
#include <functional>
#include <vector>

namespace fusetune {

struct PpoRewards {
  std::vector<double> rewards;    // -kl_coeff kl, plus each row's score at its score index
  std::vector<double> kl;         // logp - ref_logp (0 where both are masked)
  std::vector<double> kl_reward;  // -kl_coeff kl
};

// `score_index[i]`: the response index row i's score is added at (torchtune's value_seq_idxs).
PpoRewards ppo_rewards(const std::vector<double>& scores, const std::vector<double>& logps,
                       const std::vector<double>& ref_logps, double kl_coeff,
                       const std::vector<int64_t>& score_index, int64_t W);

// Sums each entry of its argument over the data-parallel ranks, in place (the distributed
// recipe's all-reduce); empty: one process. The whitening's masked sums go through it, so its
// mean and variance are the whole batch's wherever its rows live.
using PpoRankSum = std::function<void(std::vector<double>&)>;

struct PpoAdvantages {
  std::vector<double> advantages;  // whitened over `mask`, 0 outside it
  std::vector<double> returns;     // raw advantages + values
};

// Generalized Advantage Estimation (Schulman et al. 2016) over every index of each row, from
// the last back: delta_t = r_t + gamma V_{t+1} - V_t (V_W = 0), A_t = delta_t + gamma lmbda
// A_{t+1}; then the advantages are whitened over the entries where mask is 1 (on every rank's
// rows, with sum_over_ranks).
PpoAdvantages ppo_advantages(const std::vector<double>& values, const std::vector<double>& rewards,
                             double gamma, double lmbda, const std::vector<double>& mask, int64_t W,
                             const PpoRankSum& sum_over_ranks = {});

// (x - mean) / sqrt(var + 1e-8) + mean (shift_mean: the mean is added back, as torchtune's
// whiten does by default), mean and the unbiased variance over the entries where mask is 1
// (masked_mean's denominator has torchtune's + 1e-8). Fewer than two such entries is an error.
// With sum_over_ranks, the sums (and so the mean and variance) span every rank's entries.
std::vector<double> masked_whiten(const std::vector<double>& x, const std::vector<double>& mask,
                                  const PpoRankSum& sum_over_ranks = {});

}  // namespace fusetune
