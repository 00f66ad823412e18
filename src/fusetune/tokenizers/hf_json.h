#pragma once
// Typed access to tokenizer.json / tokenizer_config.json values with errors that name the
// file and the key path (e.g. "tokenizer.json at /m/tokenizer.json: pre_tokenizer.pattern").
#include <string>

#include <nlohmann/json.hpp>

#include "fusetune/util/error.h"

namespace fusetune::hf_json {

using Json = nlohmann::json;

// Where a value lives: file description plus a key path, for error messages.
struct Where {
  std::string file;  // e.g. "tokenizer.json at /m/tokenizer.json"
  std::string path;  // e.g. "pre_tokenizer.pretokenizers[1]"
  Where operator/(const std::string& key) const {
    return {file, path.empty() ? key : path + "." + key};
  }
  Where at(size_t i) const { return {file, path + "[" + std::to_string(i) + "]"}; }
  std::string str() const { return path.empty() ? file : file + ": " + path; }
};

inline const char* type_name(const Json& j) { return j.type_name(); }

inline const Json& require(const Json& obj, const char* key, const Where& w) {
  FT_CHECK(obj.is_object(), w.str() + " must be a JSON object, got " + type_name(obj));
  auto it = obj.find(key);
  FT_CHECK(it != obj.end(), (w / key).str() + " is missing");
  return *it;
}

inline const Json& require_object(const Json& obj, const char* key, const Where& w) {
  const Json& v = require(obj, key, w);
  FT_CHECK(v.is_object(), (w / key).str() + " must be an object, got " + type_name(v));
  return v;
}

inline const Json& require_array(const Json& obj, const char* key, const Where& w) {
  const Json& v = require(obj, key, w);
  FT_CHECK(v.is_array(), (w / key).str() + " must be an array, got " + type_name(v));
  return v;
}

inline std::string require_string(const Json& obj, const char* key, const Where& w) {
  const Json& v = require(obj, key, w);
  FT_CHECK(v.is_string(), (w / key).str() + " must be a string, got " + type_name(v));
  return v.get<std::string>();
}

// Optional values: absent or null -> fallback.
inline bool get_bool(const Json& obj, const char* key, bool fallback, const Where& w) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  FT_CHECK(it->is_boolean(), (w / key).str() + " must be true or false, got " + type_name(*it));
  return it->get<bool>();
}

inline std::string get_string(const Json& obj, const char* key, const std::string& fallback,
                              const Where& w) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  FT_CHECK(it->is_string(), (w / key).str() + " must be a string, got " + type_name(*it));
  return it->get<std::string>();
}

inline int64_t get_int(const Json& obj, const char* key, int64_t fallback, const Where& w) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  FT_CHECK(it->is_number_integer(), (w / key).str() + " must be an integer, got " + type_name(*it));
  return it->get<int64_t>();
}

}  // namespace fusetune::hf_json
