#pragma once
// Whole files as strings, and directory listings, for tests.
#include <filesystem>
#include <string>
#include <vector>

namespace fusetune::testing {

// The bytes of `p` ("" when it cannot be read).
std::string read_text(const std::filesystem::path& p);

// Writes `text` to `p` (creating its parent directories), replacing what was there.
void write_text(const std::filesystem::path& p, const std::string& text);

// The names of the entries of `dir`, sorted.
std::vector<std::string> sorted_entries(const std::filesystem::path& dir);

}  // namespace fusetune::testing
