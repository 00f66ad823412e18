#pragma once
// What the data layer needs from a tokenizer. Implementations: ByteTokenizer (no files; the
// embedded demo), Hugging Face tokenizer.json, SentencePiece tokenizer.model.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fusetune {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Encodes text; special/added tokens written in the text map to their ids, as HF does.
  // add_bos / add_eos follow the tokenizer's own configuration when left at their defaults.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_bos, bool add_eos) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;  // -1 when the tokenizer has none
  virtual int32_t eos_id() const = 0;
  virtual int32_t pad_id() const = 0;  // falls back to eos (or 0) when the tokenizer has none
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;
  // The tokenizer's own configuration (tokenizer_config.json add_bos_token / add_eos_token, or
  // its post-processor): what callers without a policy of their own pass to encode().
  virtual bool default_add_bos() const { return bos_id() >= 0; }
  virtual bool default_add_eos() const { return false; }
};

}  // namespace fusetune
