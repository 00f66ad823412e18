#pragma once
// Unpaired preference rows for KTO, in TRL's format (its KTOTrainer's "unpaired preference"
// dataset type): each row is a prompt, one completion and a boolean label, true when the
// completion is desirable. Two layouts, decided per row:
//   standard        {"prompt": "...", "completion": "...", "label": true}
//   conversational  {"prompt": [turns...], "completion": [turns...], "label": false}
// Turns are openai {role, content} or sharegpt {from, value}; the completion's last turn is the
// assistant's. The completion's turns are trained on (the prompt too with train_on_input).
// column_map renames the three columns. A row without a label, or whose label is not true or
// false, is a bad row (dataset.on_bad_row), named by file and line.
#include <memory>

#include "fusetune/data/dataset_options.h"
#include "fusetune/data/datasets/preference.h"
#include "fusetune/tokenizers/tokenizer.h"

namespace fusetune {

// Reads opts.source (kind "unpaired_preference"; no packing).
std::unique_ptr<PreferenceDataset> build_unpaired_preference_dataset(const DatasetOptions& opts,
                                                                     const Tokenizer& tok);

}  // namespace fusetune
