#pragma once
// What a reward scores: one sampled completion of one prompt (the GRPO recipes,
// docs/design.md §11).
#include <cstdint>
#include <map>
#include <string>

namespace fusetune {

struct ScoredCompletion {
  std::string prompt;      // the prompt's text, as the model saw it
  std::string completion;  // the generated text, up to (without) its stop token
  int64_t tokens = 0;      // generated tokens, the stop token included when there was one
  bool stopped = false;    // ended on a stop token (false: cut at max_generated_tokens)
  // The dataset row's other columns (GSM8K's `answer`, ...), by name.
  std::map<std::string, std::string> columns;
};

}  // namespace fusetune
