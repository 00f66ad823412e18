#include "fusetune/tokenizers/tiktoken_tokenizer.h"

#include <array>
#include <fstream>
#include <set>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "fusetune/tokenizers/bpe.h"
#include "fusetune/tokenizers/byte_level.h"
#include "fusetune/util/error.h"
#include "fusetune/util/fs.h"
#include "fusetune/util/strings.h"

namespace fusetune {

using Json = nlohmann::json;

const char* const kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

int base64_value(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Standard base64 with '=' padding; false on anything else.
bool base64_decode(std::string_view in, std::string& out) {
  out.clear();
  if (in.empty() || in.size() % 4 != 0) return false;
  size_t pad = 0;
  if (in.back() == '=') pad = in[in.size() - 2] == '=' ? 2 : 1;
  for (size_t i = 0; i < in.size(); i += 4) {
    uint32_t v = 0;
    const bool last = i + 4 == in.size();
    for (size_t k = 0; k < 4; ++k) {
      const unsigned char c = static_cast<unsigned char>(in[i + k]);
      int d;
      if (c == '=' && last && k >= 4 - pad)
        d = 0;
      else if ((d = base64_value(c)) < 0)
        return false;
      v = (v << 6) | uint32_t(d);
    }
    const size_t n = last ? 3 - pad : 3;
    for (size_t k = 0; k < n; ++k) out.push_back(char((v >> (16 - 8 * k)) & 0xFF));
  }
  return true;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; }

// The whitespace-separated fields of a line.
std::vector<std::string_view> fields(std::string_view line) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && is_space(line[i])) ++i;
    size_t start = i;
    while (i < line.size() && !is_space(line[i])) ++i;
    if (i > start) out.push_back(line.substr(start, i - start));
  }
  return out;
}

std::string shown(std::string_view line) {
  std::string s(line.substr(0, 60));
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7F) c = '?';
  return "'" + s + (line.size() > 60 ? "...'" : "'");
}

}  // namespace

std::vector<TiktokenEntry> parse_tiktoken(std::string_view text, const std::string& name) {
  std::vector<TiktokenEntry> out;
  std::unordered_map<std::string, size_t> by_bytes;  // token -> line
  std::unordered_map<int32_t, size_t> by_rank;
  std::string bytes;
  for_each_line(text, [&](std::string_view line, size_t line_no) {
    std::vector<std::string_view> f = fields(line);
    if (f.empty()) return;
    const std::string where = name + " line " + std::to_string(line_no);
    FT_CHECK(f.size() == 2, where + ": expected '<base64 token> <rank>', got " + shown(line) +
                                (out.empty() ? " (is this a tiktoken file? a SentencePiece "
                                               "tokenizer.model is binary: load it with the "
                                               "sentencepiece tokenizer)"
                                             : ""));
    FT_CHECK(base64_decode(f[0], bytes) && !bytes.empty(),
             where + ": '" + std::string(f[0].substr(0, 60)) + "' is not a base64 token");
    int64_t rank = 0;
    bool ok = f[1].size() <= 10;
    for (char c : f[1]) ok = ok && c >= '0' && c <= '9';
    if (ok)
      for (char c : f[1]) rank = rank * 10 + (c - '0');
    FT_CHECK(ok && rank < (int64_t(1) << 30), where + ": rank '" + std::string(f[1].substr(0, 20)) +
                                                  "' is not a non-negative integer below 2^30");
    auto [ib, new_bytes] = by_bytes.try_emplace(bytes, line_no);
    FT_CHECK(new_bytes, where + ": token " + std::string(f[0]) + " repeats line " +
                            std::to_string(ib->second));
    auto [ir, new_rank] = by_rank.try_emplace(int32_t(rank), line_no);
    FT_CHECK(new_rank, where + ": rank " + std::to_string(rank) + " repeats line " +
                           std::to_string(ir->second));
    out.push_back({bytes, int32_t(rank)});
  });
  FT_CHECK(!out.empty(), name + " holds no tokens");
  return out;
}

bool looks_like_tiktoken(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::string line;
  std::getline(in, line);
  std::vector<std::string_view> f = fields(line);
  std::string bytes;
  if (f.size() != 2 || !base64_decode(f[0], bytes)) return false;
  for (char c : f[1])
    if (c < '0' || c > '9') return false;
  return true;
}

std::vector<SpecialToken> llama3_special_tokens() {
  std::vector<SpecialToken> t = {
      {"<|begin_of_text|>", 128000},
      {"<|end_of_text|>", 128001},
      {"<|reserved_special_token_0|>", 128002},
      {"<|reserved_special_token_1|>", 128003},
      {"<|finetune_right_pad_id|>", 128004},
      {"<|step_id|>", 128005},
      {"<|start_header_id|>", 128006},
      {"<|end_header_id|>", 128007},
      {"<|eom_id|>", 128008},
      {"<|eot_id|>", 128009},
      {"<|python_tag|>", 128010},
      {"<|reserved_special_token_245|>", 128011},
      {"<|video|>", 128012},
  };
  // torchtune: 257 entries in all, 14 named (13 above and <|image|> at 128256, left out
  // here), the rest <|reserved_special_token_{2 + i}|> at 128013 + i.
  for (int i = 0; i < 257 - 14; ++i)
    t.push_back({"<|reserved_special_token_" + std::to_string(2 + i) + "|>", 128013 + i});
  return t;
}

std::unique_ptr<HfTokenizer> make_tiktoken_tokenizer(const std::vector<TiktokenEntry>& ranks,
                                                     const std::string& pattern,
                                                     const std::vector<SpecialToken>& specials,
                                                     const std::string& bos, const std::string& eos,
                                                     const std::string& pad,
                                                     const std::string& name) {
  StringMap<int32_t> vocab;
  vocab.reserve(ranks.size());
  std::array<bool, 256> have_byte{};
  std::string s;
  for (const TiktokenEntry& e : ranks) {
    if (e.bytes.size() == 1) have_byte[static_cast<unsigned char>(e.bytes[0])] = true;
    s.clear();
    byte_level::encode(e.bytes, s);
    vocab.emplace(s, e.rank);
  }
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof(hex), "0x%02X", b);
    FT_CHECK(have_byte[b], name + " has no token for the single byte " + hex +
                               ": tiktoken needs a rank for each of the 256 bytes");
  }
  BpeOptions opt;
  opt.ignore_merges = true;  // tiktoken takes a piece that is itself a token as it is
  auto model = BpeModel::from_ranks(std::move(vocab), std::move(opt), name);

  const Json pipeline = byte_level_pipeline(pattern, /*nfc=*/false, specials);
  Json config = Json::object();
  auto name_token = [&](const char* key, const std::string& tok) {
    if (tok.empty()) return;
    FT_CHECK(special_token_id(specials, tok) >= 0,
             name + ": the special tokens have no " + tok + " (needed as " + key + ")");
    config[key] = tok;
  };
  name_token("bos_token", bos);
  name_token("eos_token", eos);
  name_token("pad_token", pad);
  config["add_bos_token"] = !bos.empty();
  config["add_eos_token"] = !eos.empty();
  return HfTokenizer::from_parts(std::move(model), pipeline, config, name);
}

namespace {

std::unique_ptr<HfTokenizer> llama3_from(std::string_view model_text,
                                         const std::vector<SpecialToken>& specials,
                                         const std::string& name,
                                         const std::string& specials_name) {
  auto ranks = parse_tiktoken(model_text, name);
  for (const char* required : {"<|begin_of_text|>", "<|end_of_text|>"})
    FT_CHECK(special_token_id(specials, required) >= 0,
             specials_name + " has no " + required + ", which Llama 3 needs (BOS and EOS)");
  const std::string pad = special_token_id(specials, "<|finetune_right_pad_id|>") >= 0
                              ? "<|finetune_right_pad_id|>"
                              : "";
  return make_tiktoken_tokenizer(ranks, kLlama3Pattern, specials, "<|begin_of_text|>",
                                 "<|end_of_text|>", pad, name);
}

}  // namespace

std::unique_ptr<HfTokenizer> llama3_tiktoken_from_text(std::string_view model_text,
                                                       const std::vector<SpecialToken>& specials,
                                                       const std::string& name) {
  if (specials.empty()) return llama3_from(model_text, llama3_special_tokens(), name, name);
  return llama3_from(model_text, specials, name, name + "'s special tokens");
}

std::unique_ptr<HfTokenizer> load_llama3_tiktoken(
    const std::filesystem::path& model, const std::filesystem::path& special_tokens_path) {
  const std::string name = "tiktoken tokenizer.model at " + model.string();
  const std::string text = read_input_file(model, "tiktoken tokenizer.model");
  if (special_tokens_path.empty())
    return llama3_from(text, llama3_special_tokens(), name, "the Llama 3 special tokens");
  return llama3_from(text, read_special_tokens_file(special_tokens_path), name,
                     "special_tokens_path " + special_tokens_path.string());
}

}  // namespace fusetune
