#include "fusetune/rewards/reward_set.h"

#include <algorithm>
#include <functional>

#include "fusetune/rewards/external_reward.h"
#include "fusetune/rewards/verifiable_rewards.h"
#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune {

struct RewardSet::Term {
  std::string kind;
  double weight = 1;
  std::function<std::vector<double>(const std::vector<ScoredCompletion>&)> score;
};

namespace {

using Completions = std::vector<ScoredCompletion>;

// Applies `f` to each completion.
template <class F>
std::function<std::vector<double>(const Completions&)> each_completion(F f) {
  return [f](const Completions& batch) {
    std::vector<double> v;
    v.reserve(batch.size());
    for (const ScoredCompletion& c : batch) v.push_back(f(c));
    return v;
  };
}

void check_reward_keys(const Config& section, const std::vector<std::string>& allowed) {
  for (const std::string& k : section.keys()) {
    bool ok = k == "weight";
    for (const std::string& a : allowed) ok = ok || a == k;
    if (ok) continue;
    std::vector<std::string> all = allowed;
    all.push_back("weight");
    const std::string near = closest_match(k, all);
    throw Error("unknown config key '" + section.full_key(k) + "' (" + section.where(k) + ")" +
                (near.empty() ? "" : "; did you mean '" + near + "'?") +
                " Known keys: " + join(all, ", "));
  }
}

CompletionScorer reward_scorer(const std::string& kind, const Config& c,
                               const RewardModelLoader& reward_model) {
  if (kind == "reward_model") {
    FT_CHECK(reward_model, "config key '" + c.full_key("") +
                               "': a reward model scores completions only in a recipe that "
                               "loads it (the GRPO recipes)");
    FT_CHECK(!c.str("checkpoint_dir", "").empty(),
             "config key '" + c.full_key("checkpoint_dir") +
                 "' is required: the trained reward model's checkpoint directory");
    return reward_model(c);
  }
  if (kind == "answer_match") {
    const std::string marker = c.str("marker", "####"), column = c.str("answer_column", "answer");
    return each_completion(
        [=](const ScoredCompletion& s) { return answer_match_reward(s, marker, column); });
  }
  if (kind == "format") {
    const std::string think = c.str("think_tag", "think"), answer = c.str("answer_tag", "answer");
    FT_CHECK(!think.empty() && !answer.empty() && think != answer,
             "config keys '" + c.full_key("think_tag") +
                 "' and 'answer_tag' must be two "
                 "different non-empty tag names");
    return each_completion(
        [=](const ScoredCompletion& s) { return format_reward(s.completion, think, answer); });
  }
  if (kind == "length") {
    const int64_t lo = c.i64("min_tokens", 0), hi = c.i64("max_tokens");
    FT_CHECK(lo >= 0 && hi >= lo, "config key '" + c.full_key("max_tokens") +
                                      "' must be >= min_tokens (" + std::to_string(lo) + ")");
    return each_completion(
        [=](const ScoredCompletion& s) { return length_reward(s.tokens, lo, hi); });
  }
  if (kind == "stop_token")
    return each_completion([](const ScoredCompletion& s) { return stop_token_reward(s.stopped); });
  if (kind == "target_word") {
    const std::string word = c.str("word");
    const bool ignore_case = c.boolean("ignore_case", false);
    FT_CHECK(!word.empty(), "config key '" + c.full_key("word") + "' is empty");
    return each_completion([=](const ScoredCompletion& s) {
      return target_word_reward(s.completion, word, ignore_case);
    });
  }
  ExternalReward e{c.str("command"), c.f64("timeout_s", 60.0)};
  FT_CHECK(!e.command.empty(), "config key '" + c.full_key("command") + "' is empty");
  FT_CHECK(e.timeout_s > 0, "config key '" + c.full_key("timeout_s") + "' must be > 0");
  return [e](const Completions& batch) { return run_external_reward(e, batch); };
}

}  // namespace

const std::vector<std::pair<std::string, std::vector<std::string>>>& RewardSet::kinds() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> k = {
      {"answer_match", {"marker", "answer_column"}},
      {"format", {"think_tag", "answer_tag"}},
      {"length", {"min_tokens", "max_tokens"}},
      {"stop_token", {}},
      {"target_word", {"word", "ignore_case"}},
      {"external", {"command", "timeout_s"}},
      {"reward_model", {"checkpoint_dir", "checkpoint_files"}},
  };
  return k;
}

RewardSet RewardSet::from_config(const Config& rewards, const RewardModelLoader& reward_model) {
  RewardSet set;
  std::vector<std::string> names;
  for (const auto& [name, keys] : kinds()) names.push_back(name);
  for (const std::string& kind : rewards.keys()) {
    const auto it = std::find_if(kinds().begin(), kinds().end(),
                                 [&](const auto& k) { return k.first == kind; });
    if (it == kinds().end()) {
      const std::string near = closest_match(kind, names);
      throw Error("unknown reward '" + rewards.full_key(kind) + "' (" + rewards.where(kind) + ")" +
                  (near.empty() ? "" : "; did you mean '" + near + "'?") +
                  " Rewards: " + join(names, ", "));
    }
    // `stop_token: {}` and `stop_token:` (null) both mean the defaults.
    const Config c = rewards.is_map(kind) ? rewards.sub(kind) : Config();
    FT_CHECK(rewards.is_map(kind) || !rewards.has(kind),
             "config key '" + rewards.full_key(kind) + "' must be a map of the reward's keys");
    if (rewards.is_map(kind)) check_reward_keys(c, it->second);
    auto term = std::make_shared<Term>();
    term->kind = kind;
    term->weight = rewards.is_map(kind) ? c.f64("weight", 1.0) : 1.0;
    term->score = reward_scorer(kind, c, reward_model);
    set.terms_.push_back(std::move(term));
  }
  FT_CHECK(!set.terms_.empty(), "config key '" + rewards.full_key("") +
                                    "' names no reward; known: " + join(names, ", "));
  return set;
}

RewardSet::Scores RewardSet::score(const std::vector<ScoredCompletion>& batch) const {
  Scores s;
  s.total.assign(batch.size(), 0.0);
  for (const auto& t : terms_) {
    std::vector<double> v = t->score(batch);
    FT_CHECK(v.size() == batch.size(), "reward " + t->kind + " scored " + std::to_string(v.size()) +
                                           " of " + std::to_string(batch.size()) + " completions");
    for (size_t i = 0; i < v.size(); ++i) s.total[i] += t->weight * v[i];
    s.by_kind.emplace_back(t->kind, std::move(v));
  }
  return s;
}

}  // namespace fusetune
