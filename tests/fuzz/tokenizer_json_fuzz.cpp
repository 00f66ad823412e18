// libFuzzer target: arbitrary bytes through the tokenizer.json loader, then (for inputs that
// load) through encode and decode. Input layout: tokenizer.json text, optionally followed by
// a NUL byte and a text to encode. Any input must either load or throw fusetune::Error;
// encode/decode of a loaded tokenizer must not throw at all on short texts.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fusetune/tokenizers/hf_tokenizer.h"
#include "fusetune/util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fusetune;
  std::string_view all(reinterpret_cast<const char*>(data), size);
  size_t nul = all.find('\0');
  std::string_view json = all.substr(0, nul);
  std::string_view text =
      nul == std::string_view::npos ? "Hello world <s> 12345" : all.substr(nul + 1);
  std::unique_ptr<HfTokenizer> tok;
  try {
    tok = HfTokenizer::from_json(json, {}, "fuzz tokenizer.json");
  } catch (const Error&) {
    return 0;  // rejected cleanly: the expected outcome for most inputs
  }
  try {
    auto ids = tok->encode(text, true, true);
    auto special = tok->encode_with_special_tokens(text);
    std::string back = tok->decode(ids, false) + tok->decode(special, true);
    for (int32_t id = -2; id < 8; ++id) ids.push_back(id * 977);
    back += tok->decode(ids, false);
    volatile size_t keep = back.size();
    (void)keep;
  } catch (const Error&) {
    // A user pattern can hit PCRE2's match limit on adversarial text: reported, not crashed.
  }
  return 0;
}
