#pragma once
// Special tokens as torchtune's tokenizers take them: a table of (text, id) pairs, built in
// for each model family, or read from `special_tokens_path`, a Hugging Face tokenizer.json
// (or a JSON file shaped alike) whose "added_tokens" list gives each token's "content" and
// "id" (torchtune's parse_hf_tokenizer_json). Such a file replaces the built-in table.
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace fusetune {

struct SpecialToken {
  std::string content;
  int32_t id = -1;
};

// The "added_tokens" of a tokenizer.json-style file, in file order. Throws fusetune::Error
// naming the file and the entry when the file is not JSON, has no "added_tokens" list, or an
// entry lacks a string "content" or an integer "id", or repeats a content.
std::vector<SpecialToken> read_special_tokens_file(const std::filesystem::path& path);
std::vector<SpecialToken> parse_special_tokens_json(std::string_view json_text,
                                                    const std::string& name);

// The id of `content` in `tokens`, or -1.
int32_t special_token_id(const std::vector<SpecialToken>& tokens, std::string_view content);

// The "added_tokens" array of a tokenizer.json for HfTokenizer::from_parts: every token
// special (dropped by decode with skip_special_tokens) and matched in the raw text.
nlohmann::json special_tokens_to_added_tokens(const std::vector<SpecialToken>& tokens);

// The rest of a byte-level BPE pipeline for HfTokenizer::from_parts, as tokenizer.json writes
// it for GPT-2-style vocabularies (Llama 3's tiktoken file, Qwen's vocab.json + merges.txt):
// an optional NFC normalizer, the model family's split regex (isolated pieces) then the
// byte-to-unicode mapping, the ByteLevel decoder, and `tokens` as the added tokens.
nlohmann::json byte_level_pipeline(const std::string& split_regex, bool nfc,
                                   const std::vector<SpecialToken>& tokens);

}  // namespace fusetune
