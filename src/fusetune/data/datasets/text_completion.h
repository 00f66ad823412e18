#pragma once
// Unstructured text for continued pretraining (torchtune's text_completion_dataset).
// Source: a .txt file (documents split at <|endoftext|> markers, else at blank lines; see
// records.h) or .json/.jsonl rows with a text column (opts.column, default "text").
// Each document becomes BOS + text + EOS (BOS/EOS only when the tokenizer has them, EOS only
// when opts.add_eos); every token is a target.
#include <memory>

#include "fusetune/data/dataset.h"
#include "fusetune/data/dataset_options.h"
#include "fusetune/tokenizers/tokenizer.h"

namespace fusetune::datasets {

std::unique_ptr<SampleDataset> load_text_completion(const DatasetOptions& opts,
                                                    const Tokenizer& tok);

}  // namespace fusetune::datasets
