#pragma once
// tiktoken's tokenizer.model (Llama 3's original/tokenizer.model): one "<base64 of the token's
// bytes> <rank>" line per token, the rank being both the token id and its merge priority.
// Encoding is byte-level BPE by ranks over a pre-tokenizer regex, with special tokens added
// on top; it runs on HfTokenizer's pipeline (HfTokenizer::from_parts) with a merge table
// derived from the ranks (BpeModel::from_ranks), so its ids equal those of the same
// vocabulary's tokenizer.json.
//
// Llama 3 (torchtune's llama3_tokenizer): the pattern below; special tokens ids 128000..128255
// as torchtune names them (<|begin_of_text|>, <|end_of_text|>, <|reserved_special_token_0|>,
// <|reserved_special_token_1|>, <|finetune_right_pad_id|>, <|step_id|>, <|start_header_id|>,
// <|end_header_id|>, <|eom_id|>, <|eot_id|>, <|python_tag|>, <|reserved_special_token_245|>
// (128011), <|video|> (128012), then <|reserved_special_token_2|> .. _244|> (128013..128255)).
// torchtune also lists <|image|> at 128256, the image placeholder of Llama 3.2 Vision, one
// past the 128256-row embedding of the text models fusetune trains: it is left out, so text
// never maps to an id the model does not have. BOS <|begin_of_text|>, EOS <|end_of_text|>,
// PAD <|finetune_right_pad_id|>; encode's defaults add both BOS and EOS, as torchtune's.
// Special tokens written in the text map to their ids (fusetune's Tokenizer contract, as
// Hugging Face does; torchtune's tiktoken encode reads them as plain text).
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fusetune/tokenizers/hf_tokenizer.h"
#include "fusetune/tokenizers/special_tokens_file.h"

namespace fusetune {

struct TiktokenEntry {
  std::string bytes;  // the token's raw bytes
  int32_t rank = 0;
};

// Parses a tiktoken file's text. Blank lines are skipped. Throws fusetune::Error naming
// `name` and the line for a line that is not "<base64> <rank>", invalid base64, an empty
// token, a rank that is not a non-negative integer below 2^30, or a repeated token or rank.
std::vector<TiktokenEntry> parse_tiktoken(std::string_view text, const std::string& name);

// Whether the file's first line reads as "<base64> <rank>" (a tiktoken file rather than a
// SentencePiece protobuf, which is binary).
bool looks_like_tiktoken(const std::filesystem::path& path);

// Llama 3's pre-tokenizer regex (tiktoken's cl100k pattern, which torchtune calls
// CL100K_PATTERN).
extern const char* const kLlama3Pattern;

// torchtune's Llama 3 special tokens as fusetune registers them (see above), in id order.
std::vector<SpecialToken> llama3_special_tokens();

// A tiktoken tokenizer from parsed ranks: `pattern` splits the text, `specials` are added
// with their ids; bos/eos/pad name special tokens ("" = none). Every single byte must have a
// rank (tiktoken starts each piece from its bytes).
std::unique_ptr<HfTokenizer> make_tiktoken_tokenizer(const std::vector<TiktokenEntry>& ranks,
                                                     const std::string& pattern,
                                                     const std::vector<SpecialToken>& specials,
                                                     const std::string& bos, const std::string& eos,
                                                     const std::string& pad,
                                                     const std::string& name);

// Llama 3 from a tokenizer.model file; `special_tokens_path` (optional) replaces the built-in
// special tokens with a tokenizer.json's added_tokens, as torchtune's llama3_tokenizer does.
// The special tokens must include <|begin_of_text|> and <|end_of_text|>; PAD falls back to
// EOS when <|finetune_right_pad_id|> is absent.
std::unique_ptr<HfTokenizer> load_llama3_tiktoken(
    const std::filesystem::path& model, const std::filesystem::path& special_tokens_path = {});
// The same from texts in memory (`specials` empty = the built-in table).
std::unique_ptr<HfTokenizer> llama3_tiktoken_from_text(std::string_view model_text,
                                                       const std::vector<SpecialToken>& specials,
                                                       const std::string& name);

}  // namespace fusetune
