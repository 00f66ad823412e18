#pragma once
// A tokenizer that needs no files: ids 0..255 are the bytes of UTF-8 text, then BOS, EOS, PAD.
// Used by the embedded demo and by tests.
#include "fusetune/tokenizers/tokenizer.h"

namespace fusetune {

class ByteTokenizer : public Tokenizer {
 public:
  static constexpr int32_t kBos = 256, kEos = 257, kPad = 258, kVocab = 259;
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool add_eos) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const override;
  int64_t vocab_size() const override { return kVocab; }
  int32_t bos_id() const override { return kBos; }
  int32_t eos_id() const override { return kEos; }
  int32_t pad_id() const override { return kPad; }
  std::optional<int32_t> token_to_id(std::string_view token) const override;
};

}  // namespace fusetune
