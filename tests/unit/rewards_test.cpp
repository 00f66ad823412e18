// The GRPO rewards (rewards/): the built-in verifiable rewards, the reward set read from the
// config, and the external scorer with its failure modes (scorers written here as small shell
// scripts).
#include <chrono>
#include <fstream>

#include <gtest/gtest.h>

#include "checks.h"
#include "fusetune/config/config.h"
#include "fusetune/rewards/external_reward.h"
#include "fusetune/rewards/reward_set.h"
#include "fusetune/rewards/verifiable_rewards.h"
#include "test_support.h"

namespace fusetune {
namespace {

using testing::contains;
using testing::error_of;

ScoredCompletion completion(std::string text, int64_t tokens = 5, bool stopped = true,
                            std::map<std::string, std::string> columns = {}) {
  ScoredCompletion c;
  c.prompt = "Q: 2+2?";
  c.completion = std::move(text);
  c.tokens = tokens;
  c.stopped = stopped;
  c.columns = std::move(columns);
  return c;
}

// A shell script at dir/name with `body`, executable; returns the command that runs it.
std::string script(const testing::TempDir& dir, const std::string& name, const std::string& body) {
  const auto path = dir / name;
  std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
  std::filesystem::permissions(path, std::filesystem::perms::owner_all);
  return path.string();
}

TEST(Rewards, AnswerMatchComparesTheTextAfterTheLastMarkerWithTheAnswerColumn) {
  const std::map<std::string, std::string> gsm8k = {{"answer", "2 apples and 2 more\n#### 4"}};
  EXPECT_EQ(
      answer_match_reward(completion("so #### 3\nno, #### 4", 5, true, gsm8k), "####", "answer"),
      1.0);
  EXPECT_EQ(answer_match_reward(completion("#### 4 apples", 5, true, gsm8k), "####", "answer"),
            0.0);  // exact match, not a prefix
  EXPECT_EQ(answer_match_reward(completion("4", 5, true, gsm8k), "####", "answer"), 0.0);
  EXPECT_EQ(answer_match_reward(completion("The answer is: 4\nbye", 5, true, {{"a", "4"}}),
                                "answer is:", "a"),
            1.0);
  EXPECT_EQ(answer_match_reward(completion("  4 ", 5, true, {{"a", "4"}}), "", "a"), 1.0);
  EXPECT_TRUE(
      contains(error_of([&] { answer_match_reward(completion("#### 4"), "####", "solution"); }),
               "dataset column 'solution'"));
}

TEST(Rewards, FormatRewardGivesHalfPerWellFormedTagPairInOrder) {
  EXPECT_EQ(format_reward("<think>a</think> <answer>4</answer>", "think", "answer"), 1.0);
  EXPECT_EQ(format_reward("<think>a</think> 4", "think", "answer"), 0.5);
  EXPECT_EQ(format_reward("<answer>4</answer>", "think", "answer"), 0.5);
  EXPECT_EQ(format_reward("<answer>4</answer><think>a</think>", "think", "answer"), 0.0);
  EXPECT_EQ(format_reward("<think>a</think><think>b</think>", "think", "answer"), 0.0);
  EXPECT_EQ(format_reward("</think>a<think>", "think", "answer"), 0.0);
  EXPECT_EQ(format_reward("<r>x</r><a>y</a>", "r", "a"), 1.0);
}

TEST(Rewards, LengthStopTokenAndTargetWord) {
  EXPECT_EQ(length_reward(5, 2, 5), 1.0);
  EXPECT_EQ(length_reward(6, 2, 5), 0.0);
  EXPECT_EQ(length_reward(1, 2, 5), 0.0);
  EXPECT_EQ(stop_token_reward(true), 1.0);
  EXPECT_EQ(stop_token_reward(false), 0.0);
  EXPECT_EQ(target_word_reward("the dog ran.", "dog", false), 1.0);
  EXPECT_EQ(target_word_reward("the dogs ran", "dog", false), 0.0);  // a whole word only
  EXPECT_EQ(target_word_reward("hotdog", "dog", false), 0.0);
  EXPECT_EQ(target_word_reward("Dog!", "dog", false), 0.0);
  EXPECT_EQ(target_word_reward("Dog!", "dog", true), 1.0);
}

TEST(Rewards, RewardSetWeighsTheConfiguredKindsAndRejectsUnknownOnes) {
  const Config cfg = Config::from_string(
      "rewards:\n  target_word: {word: dog, weight: 2.0}\n  stop_token:\n"
      "  length: {max_tokens: 4}\n",
      "test.yaml");
  const RewardSet set = RewardSet::from_config(cfg.sub("rewards"));
  const auto s = set.score({completion("a dog", 3, true), completion("a cat", 9, false)});
  ASSERT_EQ(s.total.size(), 2u);
  EXPECT_EQ(s.total[0], 2.0 + 1.0 + 1.0);
  EXPECT_EQ(s.total[1], 0.0);
  ASSERT_EQ(s.by_kind.size(), 3u);
  EXPECT_EQ(s.by_kind[0].first, "target_word");
  EXPECT_EQ(s.by_kind[0].second[0], 1.0);  // unweighted

  const std::string kind = error_of([] {
    RewardSet::from_config(
        Config::from_string("rewards:\n  target_wrd: {word: x}\n", "t.yaml").sub("rewards"));
  });
  EXPECT_TRUE(contains(kind, "rewards.target_wrd")) << kind;
  EXPECT_TRUE(contains(kind, "did you mean 'target_word'")) << kind;
  const std::string key = error_of([] {
    RewardSet::from_config(
        Config::from_string("rewards:\n  length: {max_token: 3}\n", "t.yaml").sub("rewards"));
  });
  EXPECT_TRUE(contains(key, "rewards.length.max_token")) << key;
  EXPECT_TRUE(contains(key, "did you mean 'max_tokens'")) << key;
}

TEST(ExternalReward, FeedsJsonLinesAndReadsOneNumberPerLine) {
  testing::TempDir dir;
  // Scores each line by whether its completion mentions "dog"; saves what it read.
  const std::string cmd = script(dir, "score.sh",
                                 "tee " + (dir / "seen.jsonl").string() +
                                     " | while IFS= read -r line; do\n"
                                     "  case \"$line\" in *'\"completion\":\"a dog'*) echo 1.5;;"
                                     " *) echo ' -2e-1 ';; esac\ndone");
  const auto scores = run_external_reward(
      {cmd, 10}, {completion("a dog", 3, true, {{"answer", "x\"y"}}), completion("a cat")});
  ASSERT_EQ(scores.size(), 2u);
  EXPECT_EQ(scores[0], 1.5);
  EXPECT_EQ(scores[1], -0.2);
  std::ifstream seen(dir / "seen.jsonl");
  std::string first;
  std::getline(seen, first);
  EXPECT_EQ(first, R"({"answer":"x\"y","completion":"a dog","prompt":"Q: 2+2?"})");
  // Through the reward set too.
  const RewardSet set = RewardSet::from_config(
      Config::from_string("rewards:\n  external: {command: '" + cmd + "', weight: 2}\n", "t.yaml")
          .sub("rewards"));
  EXPECT_EQ(set.score({completion("a dog")}).total[0], 3.0);
}

TEST(ExternalReward, AFailingScorerStopsTheRunNamingTheCommandAndTheLine) {
  testing::TempDir dir;
  const std::vector<ScoredCompletion> two = {completion("a"), completion("b")};
  const std::string dies = script(dir, "dies.sh", "cat >/dev/null; echo 'no model' >&2; exit 3");
  std::string e = error_of([&] { run_external_reward({dies, 10}, two); });
  EXPECT_TRUE(contains(e, dies)) << e;
  EXPECT_TRUE(contains(e, "exited with status 3")) << e;
  EXPECT_TRUE(contains(e, "no model")) << e;

  const std::string garbage = script(dir, "garbage.sh", "cat >/dev/null; echo 1; echo oops");
  e = error_of([&] { run_external_reward({garbage, 10}, two); });
  EXPECT_TRUE(contains(e, garbage)) << e;
  EXPECT_TRUE(contains(e, "'oops' on line 2")) << e;

  const std::string nan = script(dir, "nan.sh", "cat >/dev/null; echo 1; echo nan");
  e = error_of([&] { run_external_reward({nan, 10}, two); });
  EXPECT_TRUE(contains(e, "'nan' on line 2")) << e;

  const std::string few = script(dir, "few.sh", "cat >/dev/null; echo 1");
  e = error_of([&] { run_external_reward({few, 10}, two); });
  EXPECT_TRUE(contains(e, few)) << e;
  EXPECT_TRUE(contains(e, "answered 1 lines for 2 completions")) << e;

  // Exits without reading its input: no SIGPIPE kills us, its answer count is the error.
  const std::string deaf = script(dir, "deaf.sh", "echo 1");
  std::vector<ScoredCompletion> many(2000, completion(std::string(200, 'x')));
  e = error_of([&] { run_external_reward({deaf, 10}, many); });
  EXPECT_TRUE(contains(e, "answered 1 lines for 2000 completions")) << e;
}

TEST(ExternalReward, AHangingScorerIsKilledAtItsTimeout) {
  testing::TempDir dir;
  const std::string hangs = script(dir, "hangs.sh", "cat >/dev/null; sleep 30; echo 1");
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = error_of([&] { run_external_reward({hangs, 0.3}, {completion("a")}); });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(contains(e, hangs)) << e;
  EXPECT_TRUE(contains(e, "did not finish within its timeout")) << e;
  EXPECT_LT(s, 5.0);  // killed, not waited for
}

}  // namespace
}  // namespace fusetune
