#pragma once
// Picks and loads a tokenizer by type:
//   byte           no file
//   hf             tokenizer.json, or a directory holding one
//   sentencepiece  SentencePiece tokenizer.model (Llama 2, Mistral), or a directory holding one
//   llama3         Llama 3's tiktoken tokenizer.model (original/tokenizer.model), or its
//                  tokenizer.json, or a directory holding either (tiktoken_tokenizer.h)
//   qwen2, qwen2_5, qwen3
//                  vocab.json + merges_file (qwen2_tokenizer.h: the same BPE, each
//                  generation's special tokens), or a tokenizer.json, or a directory holding
//                  either
//   auto           decided by what `path` is (a .json file: tokenizer.json, or vocab.json with
//                  merges.txt beside it as Qwen2.5; a .model file: tiktoken or SentencePiece by
//                  its content; a directory: tokenizer.json, tokenizer.model, vocab.json +
//                  merges.txt, original/tokenizer.model, in that order)
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fusetune/tokenizers/tokenizer.h"

namespace fusetune {

struct TokenizerSpec {
  std::string type = "auto";
  std::filesystem::path path;
  std::filesystem::path merges_file;          // qwen2 / qwen2_5 / qwen3 with a vocab.json path
  std::filesystem::path special_tokens_path;  // llama3 (tiktoken), qwen* (vocab.json)
  // qwen* with a vocab.json path: nullopt = torchtune's default, "" = none.
  std::optional<std::string> bos_token, eos_token, pad_token, unk_token;
};

// Throws fusetune::Error for an unknown type (suggesting the closest), a path that does not
// hold what the type needs, or a key that the chosen file kind cannot honour (e.g.
// special_tokens_path with a tokenizer.json, which has its own added tokens).
std::unique_ptr<Tokenizer> load_tokenizer(const TokenizerSpec& spec);
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& type,
                                          const std::filesystem::path& path);

// The tokenizer types load_tokenizer accepts.
const std::vector<std::string>& tokenizer_types();

}  // namespace fusetune
