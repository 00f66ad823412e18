#pragma once
// The external reward (docs/design.md §11): a command the config names scores a batch of
// completions without linking into fusetune. It runs once per batch under `/bin/sh -c`, reads
// one JSON object per completion on stdin ({"prompt", "completion", and the dataset row's
// other columns as strings; "prompt" and "completion" win over columns of those names}) and
// answers one number per line on stdout, in order. Anything else stops the run with an Error
// naming the command: a non-zero exit (with the tail of its stderr), a run longer than
// `timeout_s` (its process group is killed), a line that is not a finite number (its number
// and text), or a line count other than the number of completions.
#include <string>
#include <vector>

#include "fusetune/rewards/completion.h"

namespace fusetune {

struct ExternalReward {
  std::string command;
  double timeout_s = 60;
};

// The JSON line the command reads for `c` (no trailing newline).
std::string external_reward_json(const ScoredCompletion& c);

std::vector<double> run_external_reward(const ExternalReward& reward,
                                        const std::vector<ScoredCompletion>& batch);

}  // namespace fusetune
