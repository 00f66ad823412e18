#pragma once
// Hugging Face tokenizer.json with a BPE model: byte-level BPE (GPT-2, Llama 3, Qwen2/3) and
// SentencePiece-style BPE with byte fallback (Llama 2 conversions). Reads tokenizer_config.json
// (and special_tokens_map.json) beside the file for BOS/EOS/PAD and add_bos/eos defaults.
//
// Pipeline, as in tokenizers: added tokens found in the raw text -> normalizer on the rest ->
// normalized added tokens -> pre-tokenizer -> BPE per piece (cached) ; decode: ids -> token
// strings -> decoder chain -> concatenation.
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "fusetune/tokenizers/tokenizer.h"

namespace fusetune {

class BpeModel;

class HfTokenizer : public Tokenizer {
 public:
  // Reads a tokenizer.json file. Throws fusetune::Error naming the file and key at fault.
  static std::unique_ptr<HfTokenizer> from_file(const std::filesystem::path& tokenizer_json);
  // From JSON texts in memory; config_json (tokenizer_config.json) may be empty. `name`
  // stands for the file in error messages.
  static std::unique_ptr<HfTokenizer> from_json(std::string_view tokenizer_json,
                                                std::string_view config_json = {},
                                                const std::string& name = "tokenizer.json");
  // A tokenizer assembled from a BPE model built elsewhere (tiktoken ranks, vocab.json +
  // merges.txt) and the rest of a pipeline written as tokenizer.json would write it
  // (`pipeline`: normalizer, pre_tokenizer, decoder, post_processor, added_tokens; no
  // "model"). Unlike tokenizer.json, each added token takes its "id" field as written (an id
  // the vocabulary gives to another token, or a repeated id, is an error). `config` is what
  // tokenizer_config.json would hold (bos_token, eos_token, pad_token, add_bos_token,
  // add_eos_token). `name` stands for the files in error messages.
  static std::unique_ptr<HfTokenizer> from_parts(std::unique_ptr<BpeModel> model,
                                                 const nlohmann::json& pipeline,
                                                 const nlohmann::json& config,
                                                 const std::string& name);
  ~HfTokenizer() override;

  // Added/special tokens written in the text map to their ids. add_bos / add_eos prepend
  // bos_id() / append eos_id() when the tokenizer has them. Invalid UTF-8 in `text` is read
  // as U+FFFD.
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool add_eos) const override;
  // What tokenizers' encode(text, add_special_tokens=True) returns: the post-processor's
  // template, unless tokenizer_config.json sets add_bos_token / add_eos_token.
  std::vector<int32_t> encode_with_special_tokens(std::string_view text) const;
  // Unknown ids are skipped; skip_special_tokens drops added tokens marked special.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const override;

  int64_t vocab_size() const override;
  int32_t bos_id() const override;
  int32_t eos_id() const override;
  int32_t pad_id() const override;
  bool default_add_bos() const override;
  bool default_add_eos() const override;
  std::optional<int32_t> token_to_id(std::string_view token) const override;
  std::optional<std::string> id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;

 private:
  HfTokenizer();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fusetune
