#include "fusetune/tokenizers/byte_tokenizer.h"

namespace fusetune {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text, bool add_bos,
                                           bool add_eos) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() + 2);
  if (add_bos) ids.push_back(kBos);
  for (unsigned char c : text) ids.push_back(c);
  if (add_eos) ids.push_back(kEos);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  std::string out;
  for (int32_t id : ids) {
    if (id >= 0 && id < 256) {
      out.push_back(char(id));
    } else if (!skip_special_tokens) {
      out += id == kBos ? "<s>" : id == kEos ? "</s>" : id == kPad ? "<pad>" : "<unk>";
    }
  }
  return out;
}

std::optional<int32_t> ByteTokenizer::token_to_id(std::string_view token) const {
  if (token == "<s>") return kBos;
  if (token == "</s>") return kEos;
  if (token == "<pad>") return kPad;
  if (token.size() == 1) return int32_t(static_cast<unsigned char>(token[0]));
  return std::nullopt;
}

}  // namespace fusetune
