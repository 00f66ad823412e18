#pragma once
// Instruction data.
//   alpaca:   rows {instruction, input, output} (names remappable with column_map). The user
//             turn is torchtune's AlpacaToMessages prompt (alpaca_prompt below), the
//             assistant turn is `output`.
//   instruct: the same when the row has an instruction column; otherwise torchtune's
//             InputOutputToMessages: `input` is the user turn verbatim, `output` the reply.
// The turns then go through the chat format (plain for the byte tokenizer, the model's own
// template otherwise). The prompt is masked unless train_on_input.
#include <memory>
#include <string>

#include "fusetune/data/dataset.h"
#include "fusetune/data/dataset_options.h"
#include "fusetune/tokenizers/tokenizer.h"

namespace fusetune::datasets {

// The Stanford Alpaca prompt, with or without the "### Input:" section (input empty).
std::string alpaca_prompt(const std::string& instruction, const std::string& input);

std::unique_ptr<SampleDataset> load_instruct(const DatasetOptions& opts, const Tokenizer& tok);

}  // namespace fusetune::datasets
