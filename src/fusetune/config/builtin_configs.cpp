#include "fusetune/config/builtin_configs.h"

#include <algorithm>
#include <cstdlib>
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

std::vector<std::string> torchtune_config_dirs() {
  namespace fs = std::filesystem;
  std::vector<fs::path> candidates;
  if (const char* env = std::getenv("FUSETUNE_ASSETS"); env && *env)
    candidates.push_back(fs::path(env) / "torchtune_configs");
  candidates.push_back(fs::path("..") / "shared" / "assets" / "torchtune_configs");
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& c : candidates)
    if (fs::is_directory(c, ec)) out.push_back(c.string());
  return out;
}

std::string find_torchtune_config(const std::string& name) {
  namespace fs = std::filesystem;
  std::string stem = name;
  if (stem.size() > 5 && stem.compare(stem.size() - 5, 5, ".yaml") == 0)
    stem.resize(stem.size() - 5);
  if (stem.empty() || stem[0] == '/' || stem.find("..") != std::string::npos) return "";
  std::error_code ec;
  for (const auto& dir : torchtune_config_dirs()) {
    const fs::path p = fs::path(dir) / (stem + ".yaml");
    if (fs::is_regular_file(p, ec)) return p.string();
  }
  return "";
}

std::vector<std::string> torchtune_config_names() {
  namespace fs = std::filesystem;
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& dir : torchtune_config_dirs()) {
    for (auto it = fs::recursive_directory_iterator(dir, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (!it->is_regular_file(ec) || it->path().extension() != ".yaml") continue;
      std::string rel = fs::relative(it->path(), dir, ec).generic_string();
      names.push_back(rel.substr(0, rel.size() - 5));
    }
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

std::string config_text(const std::string& name_or_path) {
  if (const BuiltinConfig* b = find_builtin_config(name_or_path)) return std::string(b->text);
  std::ifstream in(name_or_path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return in ? ss.str() : std::string();
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
