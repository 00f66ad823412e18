#pragma once
// Parsing of YAML scalar text into typed values, shared by Config's accessors and schema
// validation so that "valid" means the same thing in both. YAML 1.2 core spellings: booleans
// are true/True/TRUE/false/False/FALSE (not yes/no); floats accept 1e-4 (PyYAML's YAML 1.1
// would not), .inf and .nan.
#include <cstdint>
#include <optional>
#include <string_view>

namespace fusetune {

std::optional<int64_t> parse_int(std::string_view text);
std::optional<double> parse_float(std::string_view text);
std::optional<bool> parse_bool(std::string_view text);
// A positive byte count: "1000", "5GB" (10^9), "5GiB" (2^30), "1.5MB", "300KB"; units are
// case-insensitive, as in Hugging Face's max_shard_size.
std::optional<int64_t> parse_byte_size(std::string_view text);

}  // namespace fusetune
