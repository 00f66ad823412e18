#pragma once
// SentencePiece tokenizer.model files (Llama 2, Mistral, ...) through libsentencepiece.
// Control pieces (<s>, </s>) and the unknown piece written in the text map to their ids, as
// Hugging Face's slow tokenizers do; the text between them is encoded by SentencePiece.
#include <filesystem>
#include <memory>

#include "fusetune/tokenizers/tokenizer.h"

namespace fusetune {

class SentencePieceTokenizer : public Tokenizer {
 public:
  // Throws fusetune::Error naming the file when it is missing or not a SentencePiece model.
  static std::unique_ptr<SentencePieceTokenizer> from_file(const std::filesystem::path& model);
  ~SentencePieceTokenizer() override;

  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool add_eos) const override;
  // Control and unknown pieces are special: dropped with skip_special_tokens, else written as
  // their piece text. Ids outside the vocabulary are skipped.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const override;
  int64_t vocab_size() const override;
  int32_t bos_id() const override;
  int32_t eos_id() const override;
  int32_t pad_id() const override;
  std::optional<int32_t> token_to_id(std::string_view token) const override;

 private:
  SentencePieceTokenizer();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fusetune
