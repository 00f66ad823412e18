#include "fusetune/config/yaml_tree.h"

namespace fusetune::yaml {

std::vector<std::string> split_key(const std::string& key) {
  std::vector<std::string> parts;
  if (key.empty()) return parts;
  size_t start = 0;
  for (size_t i = 0; i <= key.size(); ++i) {
    if (i == key.size() || key[i] == '.') {
      parts.push_back(key.substr(start, i - start));
      start = i + 1;
    }
  }
  return parts;
}

std::string join_key(const std::string& prefix, const std::string& key) {
  if (prefix.empty()) return key;
  if (key.empty()) return prefix;
  return prefix + "." + key;
}

YAML::Node child(const YAML::Node& map, const std::string& key) {
  if (!map.IsDefined() || !map.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
  for (auto it = map.begin(); it != map.end(); ++it) {
    if (it->first.IsScalar() && it->first.Scalar() == key) return it->second;
  }
  return YAML::Node(YAML::NodeType::Undefined);
}

YAML::Node find(const YAML::Node& root, const std::string& dotted) {
  YAML::Node cur = root;
  for (const auto& part : split_key(dotted)) {
    cur.reset(child(cur, part));  // reset, not =: Node::operator= writes through to the node
    if (!cur.IsDefined()) return cur;
  }
  return cur;
}

YAML::Node copy(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar: {
      YAML::Node out(node.Scalar());
      out.SetTag(node.Tag());
      return out;
    }
    case YAML::NodeType::Sequence: {
      YAML::Node out(YAML::NodeType::Sequence);
      for (const auto& item : node) out.push_back(copy(item));
      out.SetStyle(node.Style());
      return out;
    }
    case YAML::NodeType::Map: {
      YAML::Node out(YAML::NodeType::Map);
      for (auto it = node.begin(); it != node.end(); ++it)
        out[it->first.Scalar()] = copy(it->second);
      out.SetStyle(node.Style());
      return out;
    }
    case YAML::NodeType::Null:
      return YAML::Node(YAML::NodeType::Null);
    case YAML::NodeType::Undefined:
      break;
  }
  return YAML::Node(YAML::NodeType::Undefined);
}

std::vector<std::string> keys(const YAML::Node& map) {
  std::vector<std::string> out;
  if (!map.IsDefined() || !map.IsMap()) return out;
  for (auto it = map.begin(); it != map.end(); ++it) out.push_back(it->first.Scalar());
  return out;
}

std::string describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar: {
      std::string s = node.Scalar();
      if (s.size() > 60) s = s.substr(0, 57) + "...";
      return "'" + s + "'";
    }
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Undefined:
      break;
  }
  return "nothing";
}

}  // namespace fusetune::yaml
