#pragma once
// Shared by the data_* tests: a tokenizer with a few special tokens whose ids are easy to
// write down, and helpers to write small dataset files.
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "fusetune/data/batch.h"
#include "fusetune/tokenizers/tokenizer.h"

namespace fusetune::testing {

// The ignored label, short for expected label lists: {I, I, 98}.
inline constexpr int32_t I = kIgnoreIndex;

// Bytes are ids 0..255 (so "ab" encodes to {97, 98}); special tokens have ids >= 1000 and
// exist only for the families asked for. It never splits special strings out of text, so an
// expected layout is exactly "special ids + bytes of the text segments".
class FakeTokenizer : public Tokenizer {
 public:
  static constexpr int32_t kBegin = 1000, kStartHeader = 1001, kEndHeader = 1002, kEot = 1003,
                           kImStart = 1010, kImEnd = 1011, kBos = 1020, kEos = 1021, kPad = 1022,
                           kStartOfTurn = 1030, kEndOfTurn = 1031;
  explicit FakeTokenizer(bool llama3 = true, bool chatml = true, bool has_bos = true,
                         bool gemma = false)
      : has_bos_(has_bos) {
    if (gemma) {
      specials_["<start_of_turn>"] = kStartOfTurn;
      specials_["<end_of_turn>"] = kEndOfTurn;
    }
    if (llama3) {
      specials_["<|begin_of_text|>"] = kBegin;
      specials_["<|start_header_id|>"] = kStartHeader;
      specials_["<|end_header_id|>"] = kEndHeader;
      specials_["<|eot_id|>"] = kEot;
    }
    if (chatml) {
      specials_["<|im_start|>"] = kImStart;
      specials_["<|im_end|>"] = kImEnd;
    }
  }
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool add_eos) const override {
    std::vector<int32_t> ids;
    if (add_bos && has_bos_) ids.push_back(kBos);
    for (unsigned char c : text) ids.push_back(c);
    if (add_eos) ids.push_back(kEos);
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids, bool) const override {
    std::string s;
    for (int32_t id : ids)
      if (id < 256) s.push_back(char(id));
    return s;
  }
  int64_t vocab_size() const override { return 1100; }
  int32_t bos_id() const override { return has_bos_ ? kBos : -1; }
  int32_t eos_id() const override { return kEos; }
  int32_t pad_id() const override { return kPad; }
  std::optional<int32_t> token_to_id(std::string_view token) const override {
    auto it = specials_.find(std::string(token));
    if (it != specials_.end()) return it->second;
    return std::nullopt;
  }

 private:
  bool has_bos_;
  std::map<std::string, int32_t> specials_;
};

// Builds expected id sequences: L{kBegin, "user", kEot} -> {1000, 'u','s','e','r', 1003}.
struct Piece {
  Piece(int32_t id) : ids{id} {}  // NOLINT: implicit on purpose, for brace lists
  Piece(const char* text) {       // NOLINT
    for (const char* p = text; *p; ++p) ids.push_back(static_cast<unsigned char>(*p));
  }
  Piece(const std::string& text) {  // NOLINT
    for (unsigned char c : text) ids.push_back(c);
  }
  std::vector<int32_t> ids;
};
inline std::vector<int32_t> L(std::initializer_list<Piece> pieces) {
  std::vector<int32_t> out;
  for (const auto& p : pieces) out.insert(out.end(), p.ids.begin(), p.ids.end());
  return out;
}

inline std::string write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
  return path.string();
}

}  // namespace fusetune::testing
