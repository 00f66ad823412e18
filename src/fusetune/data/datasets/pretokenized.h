#pragma once
// Rows that are already token ids: {"input_ids": [...], "labels": [...]} in .json/.jsonl.
// labels is optional (default: every token is a target) and follows Hugging Face's
// convention: same length as input_ids, *unshifted*, -100 = ignore. Ids must be below the
// tokenizer's vocab size. Nothing is added (no BOS/EOS).
#include <memory>

#include "fusetune/data/dataset.h"
#include "fusetune/data/dataset_options.h"
#include "fusetune/tokenizers/tokenizer.h"

namespace fusetune::datasets {

std::unique_ptr<SampleDataset> load_pretokenized(const DatasetOptions& opts, const Tokenizer& tok);

}  // namespace fusetune::datasets
