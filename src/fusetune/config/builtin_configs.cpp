#include "fusetune/config/builtin_configs.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "fusetune/config/embedded_configs.h"
#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune {

std::string recipe_comment(std::string_view text) {
  for (const auto& raw : split(text, '\n')) {
    std::string line = trim(raw);
    if (line.empty()) continue;
    if (line[0] != '#') break;  // only the leading comment block counts
    std::string body = trim(std::string_view(line).substr(1));
    if (starts_with(body, "recipe:")) return trim(std::string_view(body).substr(7));
  }
  return "";
}

const std::vector<BuiltinConfig>& builtin_configs() {
  static const std::vector<BuiltinConfig> configs = [] {
    std::vector<BuiltinConfig> out;
    for (size_t i = 0; i < detail::kNumEmbeddedConfigs; ++i) {
      const auto& f = detail::kEmbeddedConfigs[i];
      std::string_view text(reinterpret_cast<const char*>(f.data), f.size);
      out.push_back({f.name, recipe_comment(text), text});
    }
    std::sort(out.begin(), out.end(),
              [](const BuiltinConfig& a, const BuiltinConfig& b) { return a.name < b.name; });
    return out;
  }();
  return configs;
}

const BuiltinConfig* find_builtin_config(const std::string& name) {
  for (const auto& c : builtin_configs())
    if (c.name == name) return &c;
  return nullptr;
}

Config load_config(const std::string& name_or_path) {
  FT_CHECK(!name_or_path.empty(), "empty --config argument");
  if (const BuiltinConfig* b = find_builtin_config(name_or_path))
    return Config::from_string(std::string(b->text), "configs/" + b->name + ".yaml");
  std::error_code ec;
  if (std::filesystem::is_regular_file(name_or_path, ec)) return Config::from_file(name_or_path);
  std::vector<std::string> names;
  for (const auto& c : builtin_configs()) names.push_back(c.name);
  std::string stem = name_or_path;
  if (stem.size() > 5 && stem.compare(stem.size() - 5, 5, ".yaml") == 0)
    stem.resize(stem.size() - 5);
  // A path into a copy of the configs folder suggests the built-in name.
  if (size_t at = stem.rfind("configs/"); at != std::string::npos) stem = stem.substr(at + 8);
  std::string msg = "config '" + name_or_path + "' is neither a file nor a built-in config";
  std::string near = closest_match(stem, names);
  if (!near.empty())
    msg += " (did you mean '" + near + "'?)";
  else
    msg += "; `fusetune ls` lists the built-in configs";
  throw Error(msg);
}

}  // namespace fusetune
