#include "fusetune/tokenizers/qwen2_tokenizer.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fusetune/tokenizers/byte_level.h"
#include "fusetune/util/error.h"
#include "fusetune/util/fs.h"
#include "fusetune/util/strings.h"

namespace fusetune {

using Json = nlohmann::json;

const char* const kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::vector<SpecialToken> qwen2_special_tokens() {
  return {{"<|endoftext|>", 151643}, {"<|im_start|>", 151644}, {"<|im_end|>", 151645}};
}

std::vector<SpecialToken> qwen2_5_special_tokens() {
  std::vector<SpecialToken> t = qwen2_special_tokens();
  const char* more[] = {
      "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",    "<|box_end|>",
      "<|quad_start|>",       "<|quad_end|>",       "<|vision_start|>", "<|vision_end|>",
      "<|vision_pad|>",       "<|image_pad|>",      "<|video_pad|>",    "<tool_call>",
      "</tool_call>",         "<|fim_prefix|>",     "<|fim_middle|>",   "<|fim_suffix|>",
      "<|fim_pad|>",          "<|repo_name|>",      "<|file_sep|>"};
  int32_t id = 151646;
  for (const char* m : more) t.push_back({m, id++});
  return t;
}

std::vector<SpecialToken> qwen3_special_tokens() {
  std::vector<SpecialToken> t = qwen2_5_special_tokens();
  int32_t id = 151665;
  for (const char* m : {"<tool_response>", "</tool_response>", "<think>", "</think>"})
    t.push_back({m, id++});
  return t;
}

std::vector<SpecialToken> qwen_special_tokens(QwenVersion version) {
  switch (version) {
    case QwenVersion::Qwen2:
      return qwen2_special_tokens();
    case QwenVersion::Qwen2_5:
      return qwen2_5_special_tokens();
    case QwenVersion::Qwen3:
      return qwen3_special_tokens();
  }
  return {};
}

namespace {
const char* version_name(QwenVersion v) {
  return v == QwenVersion::Qwen2 ? "Qwen2" : v == QwenVersion::Qwen2_5 ? "Qwen2.5" : "Qwen3";
}
}  // namespace

StringMap<int32_t> parse_vocab_json(std::string_view text, const std::string& name) {
  Json j;
  try {
    j = Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    throw Error(name + " is not valid JSON: " + e.what());
  }
  FT_CHECK(j.is_object(), name + " must be a JSON object {token: id}, got " + j.type_name());
  StringMap<int32_t> vocab;
  vocab.reserve(j.size());
  for (auto it = j.begin(); it != j.end(); ++it) {
    FT_CHECK(it.value().is_number_integer() && it.value().get<int64_t>() >= 0 &&
                 it.value().get<int64_t>() < (int64_t(1) << 30),
             name + ": token '" + it.key() + "' must map to a non-negative integer id");
    vocab.emplace(it.key(), it.value().get<int32_t>());
  }
  return vocab;
}

std::vector<std::pair<std::string, std::string>> parse_merges_txt(
    std::string_view text, const std::string& name, std::vector<size_t>* line_numbers) {
  std::vector<std::pair<std::string, std::string>> merges;
  for_each_line(text, [&](std::string_view line, size_t line_no) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) return;
    if (line_no == 1 && line.rfind("#version:", 0) == 0) return;
    const size_t sp = line.find(' ');
    FT_CHECK(sp != std::string_view::npos && sp > 0 && sp + 1 < line.size() &&
                 line.find(' ', sp + 1) == std::string_view::npos,
             name + " line " + std::to_string(line_no) +
                 ": expected two tokens separated by one "
                 "space, got '" +
                 std::string(line.substr(0, 80)) + "'");
    merges.emplace_back(std::string(line.substr(0, sp)), std::string(line.substr(sp + 1)));
    if (line_numbers) line_numbers->push_back(line_no);
  });
  return merges;
}

namespace {

std::unique_ptr<HfTokenizer> build(StringMap<int32_t> vocab,
                                   const std::vector<std::pair<std::string, std::string>>& merges,
                                   const std::vector<size_t>& merge_lines,
                                   const std::string& merges_name,
                                   const std::vector<SpecialToken>& specials, const Qwen2Options& o,
                                   const std::string& name, const std::string& specials_name) {
  for (int b = 0; b < 256; ++b)
    FT_CHECK(vocab.count(byte_level::encode_byte(static_cast<unsigned char>(b))),
             name + " lacks the byte-level token '" +
                 byte_level::encode_byte(static_cast<unsigned char>(b)) + "' (byte " +
                 std::to_string(b) + "): a byte-level vocabulary has all 256");
  // Checked here, where the line is known (BpeModel would name the merge's index).
  for (size_t i = 0; i < merges.size(); ++i) {
    const auto& [a, b] = merges[i];
    const char* missing = !vocab.count(a)       ? "its left token is"
                          : !vocab.count(b)     ? "its right token is"
                          : !vocab.count(a + b) ? "the token it makes is"
                                                : nullptr;
    FT_CHECK(!missing, merges_name + " line " + std::to_string(merge_lines[i]) + ": merge '" + a +
                           " " + b + "': " + missing + " not in vocab.json");
  }
  auto model = std::make_unique<BpeModel>(std::move(vocab), merges, BpeOptions{}, name);
  const Json pipeline =
      byte_level_pipeline(o.pattern.empty() ? kQwen2Pattern : o.pattern, o.nfc, specials);
  Json config = Json::object();
  auto choose = [&](const char* key, const std::optional<std::string>& set, const char* def) {
    const std::string tok = set ? *set : def;
    if (tok.empty()) return std::string();
    FT_CHECK(special_token_id(specials, tok) >= 0,
             "tokenizer " + std::string(key) + " '" + tok + "' is not one of " + specials_name);
    config[key] = tok;
    return tok;
  };
  const std::string bos = choose("bos_token", o.bos_token, o.default_bos.c_str());
  const std::string eos = choose("eos_token", o.eos_token, o.default_eos.c_str());
  choose("pad_token", o.pad_token, o.default_pad.c_str());
  // unk_token names the id torchtune gives a BPE result missing from vocab.json; with all 256
  // byte-level characters checked above, BpeModel never yields one, so only the name is
  // checked.
  choose("unk_token", o.unk_token, "");
  config.erase("unk_token");
  config["add_bos_token"] = !bos.empty();
  config["add_eos_token"] = !eos.empty();
  return HfTokenizer::from_parts(std::move(model), pipeline, config, name);
}

}  // namespace

std::unique_ptr<HfTokenizer> qwen2_tokenizer_from_text(std::string_view vocab_json,
                                                       std::string_view merges_txt,
                                                       const std::vector<SpecialToken>& specials,
                                                       const Qwen2Options& options,
                                                       const std::string& name) {
  const std::vector<SpecialToken> table = !specials.empty() ? specials
                                          : !options.builtin_specials.empty()
                                              ? options.builtin_specials
                                              : qwen_special_tokens(options.version);
  std::vector<size_t> lines;
  auto merges = parse_merges_txt(merges_txt, name + " (merges.txt)", &lines);
  return build(parse_vocab_json(vocab_json, name + " (vocab.json)"), merges, lines,
               name + " (merges.txt)", table, options, name, "the special tokens");
}

std::unique_ptr<HfTokenizer> load_qwen2_tokenizer(const std::filesystem::path& vocab_json,
                                                  const std::filesystem::path& merges_txt,
                                                  const Qwen2Options& o) {
  const std::string vname = "vocab.json at " + vocab_json.string();
  const std::string mname = "merges.txt at " + merges_txt.string();
  StringMap<int32_t> vocab = parse_vocab_json(read_input_file(vocab_json, "vocab.json"), vname);
  std::vector<size_t> lines;
  auto merges = parse_merges_txt(read_input_file(merges_txt, "merges_file"), mname, &lines);
  std::vector<SpecialToken> specials;
  std::string specials_name;
  if (!o.special_tokens_path.empty()) {
    specials = read_special_tokens_file(o.special_tokens_path);
    specials_name = "the added_tokens of special_tokens_path " + o.special_tokens_path.string();
  } else {
    specials = o.builtin_specials.empty() ? qwen_special_tokens(o.version) : o.builtin_specials;
    specials_name = (o.family_name.empty() ? std::string(version_name(o.version)) : o.family_name) +
                    "'s special tokens";
  }
  return build(std::move(vocab), merges, lines, mname, specials, o, vname + " + " + mname,
               specials_name);
}

}  // namespace fusetune
