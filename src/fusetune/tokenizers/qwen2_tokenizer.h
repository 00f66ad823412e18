#pragma once
// Qwen2 / Qwen2.5 from the GPT-2-style pair torchtune's qwen2_tokenizer / qwen2_5_tokenizer
// read: vocab.json ({token: id}) and merges.txt (one "left right" merge a line, best first,
// an optional "#version:" first line). Byte-level BPE on HfTokenizer's pipeline: NFC, then
// special tokens found in the text, then Qwen's pre-tokenizer regex (single digits), then the
// merges (HfTokenizer::from_parts), as in torchtune's Qwen2Tokenizer and Qwen's
// tokenizer.json.
//
// Special tokens as torchtune has them: Qwen2 <|endoftext|> 151643, <|im_start|> 151644,
// <|im_end|> 151645; Qwen2.5 adds <|object_ref_start|> .. <|file_sep|> (151646..151664).
// `special_tokens_path` replaces them with a tokenizer.json's added_tokens. Defaults as
// torchtune's: no BOS, EOS <|im_end|>, PAD <|endoftext|>; encode's defaults add EOS.
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fusetune/tokenizers/bpe.h"
#include "fusetune/tokenizers/hf_tokenizer.h"
#include "fusetune/tokenizers/special_tokens_file.h"

namespace fusetune {

// Qwen2's pre-tokenizer regex (torchtune's PRETOKENIZE_REGEX; Qwen2.5 and Qwen3 use it too).
extern const char* const kQwen2Pattern;

// The special tokens each generation adds on top of the same BPE, as torchtune has them.
enum class QwenVersion { Qwen2, Qwen2_5, Qwen3 };
std::vector<SpecialToken> qwen2_special_tokens();
std::vector<SpecialToken> qwen2_5_special_tokens();
// Qwen2.5's and <tool_response> 151665, </tool_response> 151666, <think> 151667, </think> 151668.
std::vector<SpecialToken> qwen3_special_tokens();
std::vector<SpecialToken> qwen_special_tokens(QwenVersion version);

// vocab.json's text as token -> id. Errors name `name` and the token at fault.
StringMap<int32_t> parse_vocab_json(std::string_view text, const std::string& name);
// merges.txt's text. Blank lines and a first line starting "#version:" are skipped; any other
// line must be two tokens separated by one space (errors name `name` and the line).
// `line_numbers`, when given, receives each merge's 1-based line.
std::vector<std::pair<std::string, std::string>> parse_merges_txt(
    std::string_view text, const std::string& name, std::vector<size_t>* line_numbers = nullptr);

struct Qwen2Options {
  QwenVersion version = QwenVersion::Qwen2_5;  // whose built-in special tokens
  std::filesystem::path special_tokens_path;   // replaces them when set
  // torchtune's bos_token / eos_token / pad_token / unk_token: nullopt = the default above,
  // "" = none (YAML null); else a special token's text.
  std::optional<std::string> bos_token, eos_token, pad_token, unk_token;
  // Another family's byte-level BPE on the same two files (Phi-4: tokenizers/phi_tokenizers.h):
  // its split regex (empty: kQwen2Pattern), NFC or not, BOS/EOS/PAD when not set above, and
  // its special tokens (non-empty: used instead of `version`'s).
  std::string pattern;
  bool nfc = true;
  std::string default_bos, default_eos = "<|im_end|>", default_pad = "<|endoftext|>";
  std::vector<SpecialToken> builtin_specials;
  std::string family_name;  // in messages ("Phi-4"); empty: the Qwen version's
};

// Throws fusetune::Error naming the file and line/key at fault, a special token name that is
// not among the special tokens, or a vocabulary without the 256 byte-level characters.
std::unique_ptr<HfTokenizer> load_qwen2_tokenizer(const std::filesystem::path& vocab_json,
                                                  const std::filesystem::path& merges_txt,
                                                  const Qwen2Options& options = {});
// The same from texts in memory; `specials` empty = the table options.version selects
// (options.special_tokens_path is not read here).
std::unique_ptr<HfTokenizer> qwen2_tokenizer_from_text(std::string_view vocab_json,
                                                       std::string_view merges_txt,
                                                       const std::vector<SpecialToken>& specials,
                                                       const Qwen2Options& options,
                                                       const std::string& name);

}  // namespace fusetune
