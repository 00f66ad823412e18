#include "fusetune/losses/reward.h"

#include "fusetune/util/error.h"

namespace fusetune {

Value build_last_token_scores(Builder& b, Value scores, Value last_token_mask, int64_t rows) {
  Graph& g = b.graph();
  const Shape s = g.shape(scores);
  FT_CHECK(s.size() == 2 && rows > 0 && s[0] % rows == 0, "build_last_token_scores: scores " +
                                                              shape_str(s) + " do not split into " +
                                                              std::to_string(rows) + " rows");
  const int64_t N = s[0], L = s[1], T = N / rows;
  g.set_region(1);
  // [L, N] so that the [N] mask broadcasts over the labels; one sum per (label, row).
  Value masked = b.mul(b.transpose(scores, 0, 1), last_token_mask);
  Value pooled = g.add1(Op::RowSum, {b.reshape(masked, {L * rows, T})});  // [L * rows]
  Value out = b.transpose(b.reshape(pooled, {L, rows}), 0, 1);            // [rows, L]
  g.set_region(0);
  return out;
}

RewardLossOutputs build_reward_loss(Builder& b, const RewardLoss& loss, Value rewards,
                                    Value margins, Value scale) {
  Graph& g = b.graph();
  const int64_t rows = b.shape(rewards)[0];
  FT_CHECK(rows % 2 == 0, "a reward model's batch holds pairs (an even number of rows), got " +
                              std::to_string(rows));
  const int64_t B = rows / 2;
  g.set_region(1);
  Value chosen = b.slice(rewards, 0, 0, B), rejected = b.slice(rewards, 0, B, B);
  Value d = b.add(chosen, b.scale(rejected, -1.0));
  if (margins.valid()) d = b.add(d, b.scale(margins, -1.0));
  Value losses = b.scale(g.add1(Op::LogSigmoid, {d}), -1.0);
  if (loss.center_rewards_coefficient != 0.0) {
    Value sum = b.add(chosen, rejected);
    losses = b.add(losses, b.scale(b.mul(sum, sum), loss.center_rewards_coefficient));
  }
  RewardLossOutputs out;
  out.loss = b.mul(b.sum(losses), scale);
  out.chosen_rewards = chosen;
  out.rejected_rewards = rejected;
  g.set_region(0);
  return out;
}

}  // namespace fusetune
