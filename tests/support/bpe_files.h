#pragma once
// A byte-level BPE tokenizer.json written out as the vocab.json + merges.txt pair that GPT-2
// style tokenizers (Qwen2/3, Phi-4) ship, for tests of those loaders.
#include <filesystem>

#include <nlohmann/json.hpp>

namespace fusetune::testing {

// Writes `dir`/vocab.json and `dir`/merges.txt from `tokenizer_json`'s model; returns the
// parsed tokenizer.json.
nlohmann::json write_vocab_and_merges(const std::filesystem::path& tokenizer_json,
                                      const std::filesystem::path& dir);

}  // namespace fusetune::testing
