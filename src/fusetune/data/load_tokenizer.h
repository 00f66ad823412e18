#pragma once
// Picks and loads a tokenizer by type: "byte" (no file), "hf" (tokenizer.json, or a directory
// holding one), "sentencepiece" (tokenizer.model, or a directory holding one), or "auto"
// (decided by what `path` is).
#include <filesystem>
#include <memory>
#include <string>

#include "fusetune/data/tokenizer.h"

namespace fusetune {

// Throws fusetune::Error for an unknown type (suggesting the closest) or a path that does not
// hold what the type needs.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& type,
                                          const std::filesystem::path& path);

}  // namespace fusetune
