#pragma once
// Multi-turn conversations (torchtune's chat_dataset), in either of two row styles:
//   openai:   {"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": "..."}]}
//             content may also be a list of {"type": "text", "text": "..."} parts
//   sharegpt: {"conversations": [{"from": "system"|"human"|"gpt", "value": "..."}]}
// conversation_style auto picks by the columns present. Only assistant turns are trained on
// unless train_on_input. new_system_prompt replaces the rows' system messages.
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "fusetune/data/dataset.h"
#include "fusetune/data/dataset_options.h"
#include "fusetune/data/message.h"
#include "fusetune/tokenizers/tokenizer.h"

namespace fusetune::datasets {

// Parses a list of turns (either style, decided per turn by its keys when style is "auto").
std::vector<Message> parse_conversation(const nlohmann::json& turns, const std::string& style,
                                        bool train_on_input);

std::unique_ptr<SampleDataset> load_chat(const DatasetOptions& opts, const Tokenizer& tok);

}  // namespace fusetune::datasets
