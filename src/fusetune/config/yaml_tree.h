#pragma once
// Small helpers over yaml-cpp trees that the config code shares: dotted-key lookup that never
// inserts (yaml-cpp's non-const operator[] can), deep copies without shared (aliased) nodes,
// and short descriptions of values for error messages.
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

namespace fusetune::yaml {

// "a.b.c" -> {"a", "b", "c"}; "" -> {}.
std::vector<std::string> split_key(const std::string& key);
// {"a", "b"} + "c" style joins that skip empty parts.
std::string join_key(const std::string& prefix, const std::string& key);

// The child `key` of a map, or an undefined node when absent or when `map` is not a map.
YAML::Node child(const YAML::Node& map, const std::string& key);
// The node at a dotted path under `root` ("" = root itself); undefined when absent.
YAML::Node find(const YAML::Node& root, const std::string& dotted);

// A deep copy with no node shared with the source or with itself (YAML anchors make shared
// nodes; an override must change one place only). Keeps tags and flow/block style.
YAML::Node copy(const YAML::Node& node);

// Keys of a map in order ({} for anything else).
std::vector<std::string> keys(const YAML::Node& map);

// For messages: 'abc' for a scalar (shortened), "a map", "a list", "null".
std::string describe(const YAML::Node& node);

// True when a node is absent for config purposes: undefined or null.
inline bool absent(const YAML::Node& node) { return !node.IsDefined() || node.IsNull(); }

}  // namespace fusetune::yaml
