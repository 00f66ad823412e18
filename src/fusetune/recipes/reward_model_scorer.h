#pragma once
// The GRPO reward kind `reward_model` (docs/design.md §12): a trained sequence classifier
// (reward_model_finetune_single_device's checkpoint, or any *ForSequenceClassification of one
// score) scores each completion: the prompt's text followed by the completion's, tokenized by
// the run's tokenizer, read at its last token. The classifier is frozen and keeps its own
// weights, loaded once in fp32 (its parameters' bytes beside the policy's), and its forward
// runs batched through the scoring graph, compiled in `mode`.
#include "fusetune/compile/compiler.h"
#include "fusetune/config/config.h"
#include "fusetune/rewards/reward_set.h"
#include "fusetune/tokenizers/tokenizer.h"

namespace fusetune {

// `section`: the reward's keys (checkpoint_dir, checkpoint_files); `tok` must outlive the
// scorer and share the classifier's vocabulary.
CompletionScorer reward_model_scorer(const Config& section, const Tokenizer& tok, CompileMode mode);

}  // namespace fusetune
