#pragma once
// A checkpoint's tokenizer as llama.cpp reads it from GGUF metadata (tokenizer.ggml.*):
//   - SentencePiece (tokenizer.model, or a Llama-2-style tokenizer.json: BPE with
//     byte_fallback and the "▁" space) -> model "llama": tokens, scores, token_type;
//   - GPT-2-style byte-level BPE (tokenizer.json with a ByteLevel pre-tokenizer) -> model
//     "gpt2": tokens, token_type, merges and the pre-tokenizer name llama.cpp selects its
//     split regex by ("llama-bpe" for Llama 3, "qwen2", "gpt-2").
// Anything else is a clear error. The token list is padded to the model's vocab_size (as
// llama.cpp's converter does) since llama.cpp sizes the embedding by it.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace fusetune::gguf {

// llama.cpp's token types (= SentencePiece's piece types).
enum TokenType : int32_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6
};

struct GGUFTokenizer {
  std::string model;  // "llama" or "gpt2"
  std::string pre;    // gpt2 only
  std::vector<std::string> tokens;
  std::vector<float> scores;  // llama only
  std::vector<int32_t> types;
  std::vector<std::string> merges;  // gpt2 only, "a b"
  int64_t bos = -1, eos = -1, unk = -1, pad = -1;
  // Written only when known (tokenizer_config.json, the template post-processor, or
  // SentencePiece's default); otherwise llama.cpp's default for the pre-tokenizer applies
  // (e.g. llama-bpe adds BOS).
  std::optional<bool> add_bos, add_eos;
  // What llama.cpp will not do with these tokens (e.g. a SentencePiece vocabulary it cannot
  // tokenize a newline with); the file is still written.
  std::vector<std::string> warnings;
};

class Writer;

// Reads the tokenizer files in `dir` (tokenizer.model, else tokenizer.json; plus
// tokenizer_config.json). bos/eos default to the config.json ids given. Throws
// fusetune::Error naming the file for a tokenizer llama.cpp cannot express, and warns (in
// `warnings`) about one it loads but cannot use on all text: a SentencePiece vocabulary with
// neither the byte token <0x0A> nor a "\n" piece, on which llama.cpp's tokenizer aborts as
// soon as the text holds a newline (its byte fallback finds no token for it).
GGUFTokenizer read_gguf_tokenizer(const std::filesystem::path& dir, int64_t vocab_size,
                                  int64_t bos_id, int64_t eos_id);

// Adds the tokenizer.ggml.* keys.
void add_tokenizer_metadata(Writer& w, const GGUFTokenizer& t);

}  // namespace fusetune::gguf
