#pragma once
// Hugging Face config.json <-> ModelConfig for the Llama family (llama, mistral, qwen2).
// Defaults follow transformers' LlamaConfig / MistralConfig / Qwen2Config, so a config.json
// that loads there means the same model here; anything we cannot run is a clear error.
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "fusetune/models/model_config.h"

namespace fusetune {

// Parses and validates a config.json object. `source` names the file in errors.
ModelConfig parse_model_config(const nlohmann::json& j, const std::string& source = "config.json");

// Checks a ModelConfig (parsed or built in code): sizes positive, heads divide, kv heads
// divide heads, rope scaling sane. Throws fusetune::Error naming `source` and the key.
void validate_model_config(const ModelConfig& c, const std::string& source = "config.json");

// `raw` with our fields written over it: what a saved checkpoint's config.json holds.
nlohmann::json model_config_to_json(const ModelConfig& c);

// Reads `<dir>/config.json`, or the file itself when given a file.
ModelConfig load_model_config(const std::filesystem::path& dir_or_file);

}  // namespace fusetune
