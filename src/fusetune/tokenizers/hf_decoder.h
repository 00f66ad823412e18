#pragma once
// tokenizer.json "decoder": ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, BPEDecoder
// and Sequence of them. Decoders rewrite the list of token strings; the result is their
// concatenation.
#include <memory>
#include <string>
#include <vector>

#include "fusetune/tokenizers/hf_json.h"

namespace fusetune {

class HfDecoder {
 public:
  virtual ~HfDecoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

// nullptr for a null decoder. Throws fusetune::Error for unknown or malformed ones.
std::unique_ptr<HfDecoder> make_hf_decoder(const hf_json::Json& j, const hf_json::Where& w);

}  // namespace fusetune
