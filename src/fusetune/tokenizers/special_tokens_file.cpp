#include "fusetune/tokenizers/special_tokens_file.h"

#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fusetune/tokenizers/utf8.h"
#include "fusetune/util/error.h"

namespace fusetune {

using Json = nlohmann::json;

std::vector<SpecialToken> parse_special_tokens_json(std::string_view json_text,
                                                    const std::string& name) {
  Json root;
  try {
    root = Json::parse(json_text.begin(), json_text.end());
  } catch (const Json::exception& e) {
    throw Error(name + " is not valid JSON: " + e.what());
  }
  FT_CHECK(root.is_object() && root.contains("added_tokens") && root["added_tokens"].is_array(),
           name +
               " has no \"added_tokens\" list (special_tokens_path must be a Hugging Face "
               "tokenizer.json, or a JSON file with {\"added_tokens\": [{\"content\": ..., "
               "\"id\": ...}, ...]})");
  const Json& arr = root["added_tokens"];
  std::vector<SpecialToken> out;
  std::set<std::string> seen;
  for (size_t i = 0; i < arr.size(); ++i) {
    const Json& a = arr[i];
    const std::string where = name + ": added_tokens[" + std::to_string(i) + "]";
    FT_CHECK(a.is_object() && a.contains("content") && a["content"].is_string(),
             where + " needs a string \"content\"");
    FT_CHECK(a.contains("id") && a["id"].is_number_integer(), where + " needs an integer \"id\"");
    SpecialToken t;
    t.content = a["content"].get<std::string>();
    const int64_t id = a["id"].get<int64_t>();
    FT_CHECK(!t.content.empty() && utf8::is_valid(t.content),
             where + ": \"content\" must be non-empty UTF-8");
    FT_CHECK(id >= 0 && id < (int64_t(1) << 30),
             where + ": id " + std::to_string(id) + " is out of range");
    FT_CHECK(seen.insert(t.content).second, where + " repeats the token '" + t.content + "'");
    t.id = int32_t(id);
    out.push_back(std::move(t));
  }
  return out;
}

std::vector<SpecialToken> read_special_tokens_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  FT_CHECK(in, "special_tokens_path '" + path.string() + "' not found or not readable");
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse_special_tokens_json(ss.str(), "special_tokens_path " + path.string());
}

int32_t special_token_id(const std::vector<SpecialToken>& tokens, std::string_view content) {
  for (const auto& t : tokens)
    if (t.content == content) return t.id;
  return -1;
}

Json special_tokens_to_added_tokens(const std::vector<SpecialToken>& tokens) {
  Json arr = Json::array();
  for (const auto& t : tokens)
    arr.push_back({{"id", t.id},
                   {"content", t.content},
                   {"special", true},
                   {"normalized", false},
                   {"lstrip", false},
                   {"rstrip", false},
                   {"single_word", false}});
  return arr;
}

Json byte_level_pipeline(const std::string& split_regex, bool nfc,
                         const std::vector<SpecialToken>& tokens) {
  // The ByteLevel flags below only shape offsets and decoding of a leading space, which these
  // vocabularies never use: the ids depend on the regex and the byte mapping alone.
  const Json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", false},
                           {"use_regex", false}};
  return {{"normalizer", nfc ? Json{{"type", "NFC"}} : Json(nullptr)},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers", Json::array({{{"type", "Split"},
                                            {"pattern", {{"Regex", split_regex}}},
                                            {"behavior", "Isolated"},
                                            {"invert", false}},
                                           byte_level})}}},
          {"decoder", byte_level},
          {"added_tokens", special_tokens_to_added_tokens(tokens)}};
}

}  // namespace fusetune
