#include "fusetune/losses/grpo_normalization.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "fusetune/util/error.h"

namespace fusetune {

std::vector<double> group_advantages(const std::vector<double>& rewards, int64_t group_size,
                                     bool scale_rewards) {
  FT_CHECK(group_size >= 2, "GRPO needs at least 2 completions per prompt (grpo_samples), got " +
                                std::to_string(group_size));
  const auto G = size_t(group_size);
  FT_CHECK(
      rewards.size() % G == 0,
      std::to_string(rewards.size()) + " rewards do not split into groups of " + std::to_string(G));
  std::vector<double> adv(rewards.size());
  for (size_t start = 0; start < rewards.size(); start += G) {
    double mean = 0;
    for (size_t i = 0; i < G; ++i) mean += rewards[start + i];
    mean /= double(G);
    double ss = 0;
    for (size_t i = 0; i < G; ++i) ss += (rewards[start + i] - mean) * (rewards[start + i] - mean);
    const double std = std::sqrt(ss / double(G - 1));
    for (size_t i = 0; i < G; ++i) {
      const double a = rewards[start + i] - mean;
      adv[start + i] = scale_rewards ? a / (std + 1e-4) : a;
    }
  }
  return adv;
}

std::vector<float> grpo_token_weights(GrpoLossType type, const std::vector<float>& mask,
                                      int64_t rows, int64_t T, const GrpoStepCounts& counts) {
  FT_CHECK(int64_t(mask.size()) == rows * T, "grpo_token_weights: the mask is not rows x T");
  FT_CHECK(counts.micro_batches >= 1, "grpo_token_weights: micro_batches must be >= 1");
  const double M = double(counts.micro_batches);
  double tokens = 0;
  for (float m : mask) tokens += m;
  std::vector<float> w(mask.size(), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    double row_tokens = 0;
    for (int64_t t = 0; t < T; ++t) row_tokens += mask[size_t(r * T + t)];
    double denom = 0;
    switch (type) {
      case GrpoLossType::GRPO:
        denom = std::max(1.0, row_tokens) * double(rows) * M;
        break;
      case GrpoLossType::BNPO:
        denom = std::max(1.0, tokens) * M;
        break;
      case GrpoLossType::DrGRPO:
        FT_CHECK(counts.max_completion_length > 0, "dr_grpo needs max_generated_tokens > 0");
        denom = double(rows) * double(counts.max_completion_length) * M;
        break;
      case GrpoLossType::DAPO:
        FT_CHECK(counts.step_tokens > 0 || tokens == 0, "dapo needs the step's token count");
        denom = std::max<double>(1.0, double(counts.step_tokens));
        break;
    }
    for (int64_t t = 0; t < T; ++t)
      w[size_t(r * T + t)] = float(double(mask[size_t(r * T + t)]) / denom);
  }
  return w;
}

}  // namespace fusetune
