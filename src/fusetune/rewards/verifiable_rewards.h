#pragma once
// Built-in verifiable rewards (docs/design.md §11): pure functions of one completion, each
// returning a number in [0, 1] that the reward set weighs.
//
// - answer_match: the text after the last `marker` in the completion (to the end of its line,
//   trimmed) equals the dataset's answer column, itself cut after its last marker when it has
//   one (GSM8K's answers end "#### 72"). With marker "" the whole trimmed completion is the
//   answer. torchtune's GSM8K reward compares the answer tag's text the same way: exact match.
// - format: tagged reasoning, `<think>...</think>` then `<answer>...</answer>` (tag names
//   configurable): half for each tag pair that occurs exactly once, well nested, the think
//   pair before the answer pair (torchtune's shaped reward gives points per tag pair).
// - length: 1 when the completion's token count is within [min_tokens, max_tokens].
// - stop_token: 1 when the completion ended on a stop token rather than being cut off.
// - target_word: 1 when `word` occurs in the completion as a whole word (letters, digits and
//   '_' do not continue it on either side); optionally ignoring ASCII case.
#include <cstdint>
#include <string>

#include "fusetune/rewards/completion.h"

namespace fusetune {

// The answer after the last `marker` in `text` (to the end of that line, trimmed) into *out;
// false when the marker does not occur. Marker "" gives the whole trimmed text.
bool extract_marked_answer(const std::string& text, const std::string& marker, std::string* out);

double answer_match_reward(const ScoredCompletion& c, const std::string& marker,
                           const std::string& answer_column);
double format_reward(const std::string& completion, const std::string& think_tag,
                     const std::string& answer_tag);
double length_reward(int64_t tokens, int64_t min_tokens, int64_t max_tokens);
double stop_token_reward(bool stopped);
double target_word_reward(const std::string& completion, const std::string& word, bool ignore_case);

}  // namespace fusetune
