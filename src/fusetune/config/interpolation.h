#pragma once
// OmegaConf-style `${...}` interpolation over a config tree (see Config::resolve for the forms).
// Kept apart from Config so the resolution rules read in one place.
#include <functional>
#include <string>

#include <yaml-cpp/yaml.h>

namespace fusetune {

// True when a scalar text holds `${` (escaped `\${` too: resolving turns it into `${`).
bool has_interpolation(const std::string& text);

// Returns `value` (the value of full dotted key `key` in `root`) with every `${...}` resolved,
// recursively through referenced values; lists and maps are resolved element by element into
// a fresh copy. `where(key)` names a key's origin for error messages.
YAML::Node interpolate(const YAML::Node& root, const std::string& key, const YAML::Node& value,
                       const std::function<std::string(const std::string&)>& where);

}  // namespace fusetune
