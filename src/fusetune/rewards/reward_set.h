#pragma once
// The rewards a GRPO run scores its completions with (docs/design.md §11), from the config's
// `rewards` map: one entry per kind, each with its keys and a `weight` (default 1); a
// completion's reward is the weighted sum.
//
//   rewards:
//     answer_match: {marker: "####", answer_column: answer}   # verifiable_rewards.h
//     format: {think_tag: think, answer_tag: answer}
//     length: {min_tokens: 0, max_tokens: 64}
//     stop_token: {}
//     target_word: {word: dog, ignore_case: false}
//     external: {command: "python3 score.py", timeout_s: 60}  # external_reward.h
//     reward_model: {checkpoint_dir: /path/to/reward_model}  # a trained classifier's score
//
// An unknown kind or key is an Error naming it and the closest known one.
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fusetune/config/config.h"
#include "fusetune/rewards/completion.h"

namespace fusetune {

// Scores a batch of completions, one value each.
using CompletionScorer = std::function<std::vector<double>(const std::vector<ScoredCompletion>&)>;
// Makes the scorer of a `reward_model` reward from its section: the recipe supplies it, since
// a model lives in a layer above this one (docs/design.md §12).
using RewardModelLoader = std::function<CompletionScorer(const Config& section)>;

class RewardSet {
 public:
  // `rewards` is the config's `rewards` map (a view: its errors name `rewards.<kind>.<key>`).
  // `reward_model` loads a `reward_model` reward's classifier (none: that kind is an error).
  static RewardSet from_config(const Config& rewards, const RewardModelLoader& reward_model = {});
  // The reward kinds and their keys, for validation and the docs.
  static const std::vector<std::pair<std::string, std::vector<std::string>>>& kinds();

  struct Scores {
    std::vector<double> total;  // per completion, the weighted sum
    // Per kind, in config order: its unweighted value per completion (for the step line).
    std::vector<std::pair<std::string, std::vector<double>>> by_kind;
  };
  Scores score(const std::vector<ScoredCompletion>& batch) const;
  bool empty() const { return terms_.empty(); }

 private:
  struct Term;
  std::vector<std::shared_ptr<const Term>> terms_;
};

}  // namespace fusetune
