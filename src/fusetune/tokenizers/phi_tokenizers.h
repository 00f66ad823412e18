#pragma once
// The tokenizers of torchtune's phi3_mini_tokenizer and phi4_tokenizer.
//
// Phi-3 (mini): Llama 2's SentencePiece tokenizer.model (32,000 pieces) and Phi-3's added tokens
// 32000..32010 (<|endoftext|>, <|assistant|>, <|system|>, <|end|>, <|user|> and placeholders;
// the model's vocabulary pads to 32,064). As torchtune's Phi3MiniTokenizer: text is encoded by
// SentencePiece alone (special tokens enter through the chat format, by id), BOS <s>, EOS and
// PAD <|endoftext|>.
//
// Phi-4: byte-level BPE from vocab.json + merges.txt with cl100k's split regex (no NFC), and
// its special tokens 100256..100351 (<|endoftext|>, <|im_start|>, <|im_sep|>, <|im_end|>,
// <|endofprompt|>, <|dummy_N|>); BOS <|endoftext|>, EOS <|im_end|>, PAD <|dummy_85|>, as
// torchtune's Phi4Tokenizer.
#include <filesystem>
#include <memory>
#include <vector>

#include "fusetune/tokenizers/hf_tokenizer.h"
#include "fusetune/tokenizers/qwen2_tokenizer.h"
#include "fusetune/tokenizers/sentencepiece_tokenizer.h"

namespace fusetune {

std::vector<SpecialToken> phi3_special_tokens();
std::vector<SpecialToken> phi4_special_tokens();

class Phi3MiniTokenizer : public Tokenizer {
 public:
  // Throws fusetune::Error naming the file when it is not a SentencePiece model, or when its
  // pieces reach the added tokens' ids.
  static std::unique_ptr<Phi3MiniTokenizer> from_file(const std::filesystem::path& model);

  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool add_eos) const override;
  // Added tokens are written as their text, or dropped with skip_special_tokens.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const override;
  int64_t vocab_size() const override;
  int32_t bos_id() const override { return sp_->bos_id(); }
  int32_t eos_id() const override { return kEndOfText; }
  int32_t pad_id() const override { return kEndOfText; }
  std::optional<int32_t> token_to_id(std::string_view token) const override;

 private:
  static constexpr int32_t kEndOfText = 32000;
  explicit Phi3MiniTokenizer(std::unique_ptr<SentencePieceTokenizer> sp) : sp_(std::move(sp)) {}
  std::unique_ptr<SentencePieceTokenizer> sp_;
  std::vector<SpecialToken> added_ = phi3_special_tokens();
};

// `options`' pattern, NFC, defaults and table are Phi-4's; its bos/eos/pad_token and
// special_tokens_path apply as for Qwen.
std::unique_ptr<HfTokenizer> load_phi4_tokenizer(const std::filesystem::path& vocab_json,
                                                 const std::filesystem::path& merges_txt,
                                                 Qwen2Options options = {});
// The Qwen2Options that make load_qwen2_tokenizer Phi-4's.
Qwen2Options phi4_options(Qwen2Options options = {});

}  // namespace fusetune
