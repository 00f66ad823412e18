#pragma once
// build_dataset: DatasetOptions (from the config's `dataset:` section) -> a ready Dataset.
//   kind text_completion  .txt / .json / .jsonl text          (datasets/text_completion.h)
//   kind pretokenized     input_ids [+ labels] rows           (datasets/pretokenized.h)
//   kind alpaca|instruct  instruction/input/output rows       (datasets/instruct.h)
//   kind chat             openai messages / sharegpt rows     (datasets/chat.h)
//   kind gsm8k            question (+ answer) rows as prompts (datasets/prompts.h; GRPO)
// Preference (DPO) pairs are not a Dataset of samples: build_preference_dataset
// (datasets/preference.h).
// With packed: true the samples are packed into rows of max_seq_len (packing.h).
// Errors (unknown kind, bad rows, empty result) are fusetune::Error naming the file and row.
#include <memory>
#include <string>
#include <vector>

#include "fusetune/data/dataset.h"
#include "fusetune/data/dataset_options.h"
#include "fusetune/tokenizers/tokenizer.h"

namespace fusetune {

std::vector<std::string> dataset_kinds();

std::unique_ptr<Dataset> build_dataset(const DatasetOptions& opts, const Tokenizer& tok);

}  // namespace fusetune
