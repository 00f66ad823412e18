#include "fusetune/io/gguf_tokenizer.h"

#include <sentencepiece_processor.h>

#include <fstream>
#include <map>
#include <regex>

#include <nlohmann/json.hpp>

#include "fusetune/io/gguf_writer.h"
#include "fusetune/util/error.h"

namespace fusetune::gguf {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json read_json(const fs::path& p) {
  std::ifstream in(p);
  FT_CHECK(in, "cannot read '" + p.string() + "'");
  try {
    return json::parse(in);
  } catch (const std::exception& e) {
    throw Error("'" + p.string() + "' is not valid JSON: " + e.what());
  }
}

// Every object in a (possibly Sequence) normalizer / pre_tokenizer / decoder tree.
void collect(const json& j, std::vector<json>& out) {
  if (!j.is_object()) return;
  out.push_back(j);
  for (const char* k : {"normalizers", "pretokenizers", "decoders"})
    if (j.contains(k) && j[k].is_array())
      for (const auto& c : j[k]) collect(c, out);
}
bool has_type(const json& tree, const std::string& type, std::vector<json>* found = nullptr) {
  std::vector<json> all;
  collect(tree, all);
  bool any = false;
  for (const auto& j : all)
    if (j.value("type", "") == type) {
      any = true;
      if (found) found->push_back(j);
    }
  return any;
}

GGUFTokenizer from_sentencepiece(const fs::path& file) {
  sentencepiece::SentencePieceProcessor sp;
  const auto status = sp.Load(file.string());
  FT_CHECK(status.ok(),
           "cannot load SentencePiece model '" + file.string() + "': " + status.ToString());
  GGUFTokenizer t;
  t.model = "llama";
  for (int id = 0; id < sp.GetPieceSize(); ++id) {
    t.tokens.push_back(sp.IdToPiece(id));
    t.scores.push_back(sp.GetScore(id));
    // (libsentencepiece does not tell user-defined pieces apart: they come out normal)
    t.types.push_back(sp.IsUnknown(id)   ? kUnknown
                      : sp.IsControl(id) ? kControl
                      : sp.IsUnused(id)  ? kUnused
                      : sp.IsByte(id)    ? kByte
                                         : kNormal);
  }
  t.bos = sp.bos_id();
  t.eos = sp.eos_id();
  t.unk = sp.unk_id();
  t.pad = sp.pad_id();
  t.add_bos = true;  // LlamaTokenizer's default
  t.add_eos = false;
  return t;
}

// A Llama-2-style tokenizer.json (SentencePiece BPE exported by transformers): llama.cpp's
// SentencePiece tokenizer merges the adjacent pair whose joined piece has the highest score,
// so a piece's score is minus the rank of the merge that makes it (BPE's order).
GGUFTokenizer from_spm_json(const json& model, const fs::path& file) {
  GGUFTokenizer t;
  t.model = "llama";
  const json& vocab = model.at("vocab");
  std::map<std::string, int64_t> rank;
  int64_t r = 0;
  const json merges = model.value("merges", json::array());
  FT_CHECK(merges.is_array(), "'" + file.string() + "': model.merges is not an array");
  for (const auto& m : merges) {
    std::string joined;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const auto sp = s.find(' ');
      FT_CHECK(sp != std::string::npos, "'" + file.string() + "': merge '" + s + "' has no space");
      joined = s.substr(0, sp) + s.substr(sp + 1);
    } else {
      joined = m.at(0).get<std::string>() + m.at(1).get<std::string>();
    }
    rank.emplace(joined, r++);  // the first (best) merge that makes a piece
  }
  t.tokens.resize(vocab.size());
  t.scores.assign(vocab.size(), 0.0f);
  t.types.assign(vocab.size(), kNormal);
  static const std::regex byte_piece("<0x[0-9A-Fa-f]{2}>");
  for (const auto& [piece, idj] : vocab.items()) {
    const int64_t id = idj.get<int64_t>();
    FT_CHECK(id >= 0 && id < int64_t(vocab.size()),
             "'" + file.string() + "': token id " + std::to_string(id) + " outside the vocab");
    t.tokens[size_t(id)] = piece;
    const auto it = rank.find(piece);
    if (it != rank.end()) t.scores[size_t(id)] = -float(it->second);
    if (std::regex_match(piece, byte_piece)) t.types[size_t(id)] = kByte;
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    const auto u = vocab.find(model["unk_token"].get<std::string>());
    if (u != vocab.end()) {
      t.unk = u->get<int64_t>();
      t.types[size_t(t.unk)] = kUnknown;
    }
  }
  return t;
}

// llama.cpp picks its pre-tokenizer regex by name; we recognize the split patterns we know.
std::string bpe_pre_name(const json& pre, const fs::path& file) {
  std::vector<json> splits;
  has_type(pre, "Split", &splits);
  if (splits.empty()) return "gpt-2";  // ByteLevel with its own GPT-2 regex
  const std::string pat = splits[0].value("pattern", json::object()).value("Regex", "");
  const std::string common = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}";
  const std::string rest = "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  if (pat == common + "{1,3}" + rest) return "llama-bpe";
  if (pat == common + rest) return "qwen2";
  throw Error("'" + file.string() + "': its pre-tokenizer split pattern is not one llama.cpp " +
              "names (known: Llama 3 'llama-bpe', Qwen2 'qwen2', GPT-2 'gpt-2'); cannot export");
}

GGUFTokenizer from_bpe_json(const json& j, const fs::path& file) {
  GGUFTokenizer t;
  t.model = "gpt2";
  t.pre = bpe_pre_name(j.value("pre_tokenizer", json()), file);
  const json& vocab = j.at("model").at("vocab");
  t.tokens.resize(vocab.size());
  t.types.assign(vocab.size(), kNormal);
  for (const auto& [piece, idj] : vocab.items()) {
    const int64_t id = idj.get<int64_t>();
    FT_CHECK(id >= 0 && id < int64_t(vocab.size()),
             "'" + file.string() + "': token id " + std::to_string(id) + " outside the vocab");
    t.tokens[size_t(id)] = piece;
  }
  const json merges = j.at("model").value("merges", json::array());
  FT_CHECK(merges.is_array(), "'" + file.string() + "': model.merges is not an array");
  for (const auto& m : merges)
    t.merges.push_back(m.is_string()
                           ? m.get<std::string>()
                           : m.at(0).get<std::string>() + " " + m.at(1).get<std::string>());
  return t;
}

// llama.cpp's SentencePiece tokenizer (llm_tokenizer_spm) turns text no piece covers into
// byte tokens, byte by byte: the piece "<0xNN>", else the piece that is the byte itself, else
// it throws std::out_of_range (token_to_id.at) and the program aborts. A vocabulary with
// neither for '\n' therefore cannot tokenize any text with a newline.
void warn_missing_newline(GGUFTokenizer& t, const fs::path& dir) {
  static const std::regex byte_piece("<0x[0-9A-Fa-f]{2}>");
  int byte_tokens = 0;
  bool newline_byte = false, newline_piece = false;
  for (const std::string& piece : t.tokens) {
    if (std::regex_match(piece, byte_piece)) {
      ++byte_tokens;
      newline_byte = newline_byte || piece == "<0x0A>" || piece == "<0x0a>";
    }
    newline_piece = newline_piece || piece == "\n";
  }
  if (newline_byte || newline_piece) return;
  const std::string bytes =
      byte_tokens == 0 ? "no byte tokens (<0x00> ... <0xFF>)"
                       : std::to_string(byte_tokens) + " of the 256 byte tokens but not <0x0A>";
  t.warnings.push_back("the SentencePiece vocabulary in '" + dir.string() + "' has " + bytes +
                       " and no \"\\n\" piece: llama.cpp aborts as soon as it tokenizes text "
                       "with a newline (or any other character no piece covers)");
}

}  // namespace

GGUFTokenizer read_gguf_tokenizer(const fs::path& dir, int64_t vocab_size, int64_t bos_id,
                                  int64_t eos_id) {
  GGUFTokenizer t;
  json tj;
  const fs::path json_file = dir / "tokenizer.json";
  if (fs::exists(dir / "tokenizer.model")) {
    t = from_sentencepiece(dir / "tokenizer.model");
  } else {
    FT_CHECK(fs::exists(json_file), "'" + dir.string() +
                                        "' has no tokenizer.model or tokenizer.json: GGUF needs "
                                        "the tokenizer");
    tj = read_json(json_file);
    const json model = tj.value("model", json::object());
    FT_CHECK(model.value("type", "") == "BPE",
             "'" + json_file.string() + "': model type '" + model.value("type", "") +
                 "' has no GGUF tokenizer (only BPE: SentencePiece-style or byte-level)");
    const bool byte_level = has_type(tj.value("pre_tokenizer", json()), "ByteLevel");
    const bool spm_style = model.value("byte_fallback", false) ||
                           has_type(tj.value("pre_tokenizer", json()), "Metaspace") ||
                           has_type(tj.value("normalizer", json()), "Prepend");
    if (byte_level) {
      t = from_bpe_json(tj, json_file);
    } else if (spm_style) {
      t = from_spm_json(model, json_file);
      t.add_bos = true;  // LlamaTokenizer's default, unless the files below say otherwise
      t.add_eos = false;
    } else {
      throw Error("'" + json_file.string() +
                  "': a BPE tokenizer that is neither byte-level (GPT-2 style) nor "
                  "SentencePiece-style (byte_fallback / Metaspace); llama.cpp cannot express it");
    }
    // Added tokens: special ones are control tokens, the others user-defined.
    for (const auto& a : tj.value("added_tokens", json::array())) {
      const int64_t id = a.at("id").get<int64_t>();
      if (id >= int64_t(t.tokens.size())) {
        t.tokens.resize(size_t(id) + 1);
        t.types.resize(size_t(id) + 1, kUnused);
        if (!t.scores.empty()) t.scores.resize(size_t(id) + 1, 0.0f);
      }
      t.tokens[size_t(id)] = a.at("content").get<std::string>();
      t.types[size_t(id)] = a.value("special", false) ? kControl : kUserDefined;
    }
    if (t.unk >= 0) t.types[size_t(t.unk)] = kUnknown;
  }
  FT_CHECK(int64_t(t.tokens.size()) <= vocab_size,
           "the tokenizer in '" + dir.string() + "' has " + std::to_string(t.tokens.size()) +
               " tokens, more than the model's vocab_size " + std::to_string(vocab_size));
  for (size_t i = t.tokens.size(); i < size_t(vocab_size); ++i) {  // as llama.cpp's converter
    t.tokens.push_back("[PAD" + std::to_string(i) + "]");
    t.types.push_back(kUnused);
    if (t.model == "llama") t.scores.push_back(0.0f);
  }
  for (size_t i = 0; i < t.tokens.size(); ++i)
    FT_CHECK(!t.tokens[i].empty() || t.types[i] == kUnused,
             "the tokenizer in '" + dir.string() + "' has no token with id " + std::to_string(i));

  if (bos_id >= 0) t.bos = bos_id;
  if (eos_id >= 0) t.eos = eos_id;
  const fs::path cfg_file = dir / "tokenizer_config.json";
  json cfg = fs::exists(cfg_file) ? read_json(cfg_file) : json::object();
  if (!fs::exists(dir / "tokenizer.model")) {
    // The template post-processor says whether a BOS is added (Llama 3 has no add_bos_token).
    const json pp = tj.value("post_processor", json());
    std::vector<json> tmpl;
    has_type(pp, "TemplateProcessing", &tmpl);
    if (!tmpl.empty() && tmpl[0].contains("single") && !tmpl[0]["single"].empty()) {
      const json& first = tmpl[0]["single"][0];
      t.add_bos = first.contains("SpecialToken");
    }
  }
  // bos/eos named by tokenizer_config.json when config.json has no ids.
  auto id_of = [&](const char* key) -> int64_t {
    if (!cfg.contains(key)) return -1;
    const json& v = cfg[key];
    const std::string s = v.is_string()                            ? v.get<std::string>()
                          : v.is_object() && v.contains("content") ? v["content"].get<std::string>()
                                                                   : "";
    for (size_t i = 0; i < t.tokens.size() && !s.empty(); ++i)
      if (t.tokens[i] == s) return int64_t(i);
    return -1;
  };
  if (t.bos < 0) t.bos = id_of("bos_token");
  if (t.eos < 0) t.eos = id_of("eos_token");
  if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean())
    t.add_bos = cfg["add_bos_token"].get<bool>();
  if (cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean())
    t.add_eos = cfg["add_eos_token"].get<bool>();
  if (t.model == "llama") warn_missing_newline(t, dir);
  return t;
}

void add_tokenizer_metadata(Writer& w, const GGUFTokenizer& t) {
  w.add_string("tokenizer.ggml.model", t.model);
  if (!t.pre.empty()) w.add_string("tokenizer.ggml.pre", t.pre);
  w.add_strings("tokenizer.ggml.tokens", t.tokens);
  if (!t.scores.empty()) w.add_f32s("tokenizer.ggml.scores", t.scores);
  w.add_i32s("tokenizer.ggml.token_type", t.types);
  if (!t.merges.empty()) w.add_strings("tokenizer.ggml.merges", t.merges);
  if (t.bos >= 0) w.add_u32("tokenizer.ggml.bos_token_id", uint32_t(t.bos));
  if (t.eos >= 0) w.add_u32("tokenizer.ggml.eos_token_id", uint32_t(t.eos));
  if (t.unk >= 0) w.add_u32("tokenizer.ggml.unknown_token_id", uint32_t(t.unk));
  if (t.pad >= 0) w.add_u32("tokenizer.ggml.padding_token_id", uint32_t(t.pad));
  if (t.add_bos) w.add_bool("tokenizer.ggml.add_bos_token", *t.add_bos);
  if (t.add_eos) w.add_bool("tokenizer.ggml.add_eos_token", *t.add_eos);
}

}  // namespace fusetune::gguf
