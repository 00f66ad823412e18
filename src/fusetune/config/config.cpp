#include "fusetune/config/config.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "fusetune/config/interpolation.h"
#include "fusetune/config/scalars.h"
#include "fusetune/config/yaml_tree.h"
#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune {

struct Config::Doc {
  YAML::Node root{YAML::NodeType::Map};
  std::string source = "<empty>";
  std::map<std::string, int> lines;              // full dotted key -> 1-based line in source
  std::map<std::string, std::string> overrides;  // full dotted key -> the override that set it
  bool resolved = false;
};

namespace {

// Copies the parsed tree into one with no shared (aliased) nodes, recording each key's line
// and refusing duplicate keys, non-scalar keys and recursive aliases.
// A YAML file of a few KB can expand to billions of nodes through aliases of aliases; a config
// has hundreds.
constexpr size_t kMaxConfigNodes = 1'000'000;

YAML::Node import_tree(const YAML::Node& node, const std::string& key, const std::string& source,
                       std::map<std::string, int>& lines, std::vector<YAML::Node>& ancestors,
                       size_t& count) {
  FT_CHECK(++count <= kMaxConfigNodes, source + ": the config expands to more than " +
                                           std::to_string(kMaxConfigNodes) +
                                           " values (aliases of aliases?)");
  if (!node.IsMap() && !node.IsSequence()) return yaml::copy(node);
  for (const auto& a : ancestors)
    FT_CHECK(!a.is(node), source + ":" + std::to_string(node.Mark().line + 1) +
                              ": recursive YAML alias under key '" + key + "'");
  ancestors.push_back(node);
  YAML::Node out(node.Type());
  if (node.IsSequence()) {
    for (size_t i = 0; i < node.size(); ++i)
      out.push_back(import_tree(node[i], key + "[" + std::to_string(i) + "]", source, lines,
                                ancestors, count));
  } else {
    for (auto it = node.begin(); it != node.end(); ++it) {
      int line = it->first.Mark().line + 1;
      FT_CHECK(it->first.IsScalar(), source + ":" + std::to_string(line) +
                                         ": config keys must be plain names, not lists or maps");
      const std::string& k = it->first.Scalar();
      std::string full = yaml::join_key(key, k);
      FT_CHECK(!yaml::child(out, k).IsDefined(),
               source + ":" + std::to_string(line) + ": duplicate key '" + full +
                   "' (first at line " + std::to_string(lines[full]) + ")");
      lines[full] = line;
      out[k] = import_tree(it->second, full, source, lines, ancestors, count);
    }
  }
  out.SetStyle(node.Style());
  ancestors.pop_back();
  return out;
}

bool valid_key(const std::string& key) {
  if (key.empty()) return false;
  for (const auto& part : yaml::split_key(key)) {
    if (part.empty()) return false;
    for (char c : part) {
      bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
      if (!ok) return false;
    }
  }
  return true;
}

// The value of one override: YAML, except that text which YAML reads as a map but was not
// written as `{...}` ("Question: {x}") stays text, and an empty value is the empty string.
YAML::Node parse_override_value(const std::string& arg, const std::string& text) {
  if (text.empty()) {
    YAML::Node n(std::string{});
    n.SetTag("!");
    return n;
  }
  YAML::Node parsed;
  try {
    parsed = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw Error("override '" + arg + "': the value is not valid YAML: " + e.msg);
  }
  if (parsed.IsMap() && trim(text).rfind('{', 0) != 0) {
    YAML::Node n(text);
    n.SetTag("!");
    return n;
  }
  if (!parsed.IsDefined()) return YAML::Node(YAML::NodeType::Null);
  std::map<std::string, int> lines;
  std::vector<YAML::Node> ancestors;
  size_t count = 0;
  return import_tree(parsed, "", "override '" + arg + "'", lines, ancestors, count);
}

}  // namespace

Config::Config() : doc_(std::make_shared<Doc>()) {}

Config::Config(std::shared_ptr<Doc> doc, std::string prefix)
    : doc_(std::move(doc)), prefix_(std::move(prefix)) {}

Config Config::from_file(const std::string& path) {
  std::error_code ec;
  FT_CHECK(!std::filesystem::is_directory(path, ec),
           "config '" + path + "' is a directory, not a YAML file");
  std::ifstream in(path, std::ios::binary);
  FT_CHECK(in, "cannot open config file '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  FT_CHECK(!in.bad(), "cannot read config file '" + path + "'");
  return from_string(ss.str(), path);
}

Config Config::from_string(const std::string& text, const std::string& source_name) {
  YAML::Node parsed;
  try {
    parsed = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    throw Error(source_name + ":" + std::to_string(e.mark.line + 1) + ":" +
                std::to_string(e.mark.column + 1) + ": invalid YAML: " + e.msg);
  } catch (const YAML::Exception& e) {
    throw Error(source_name + ": invalid YAML: " + e.msg);
  }
  auto doc = std::make_shared<Doc>();
  doc->source = source_name;
  if (parsed.IsDefined() && !parsed.IsNull()) {
    FT_CHECK(parsed.IsMap(), source_name +
                                 ": a config must be a YAML map of `key: value` lines, got " +
                                 yaml::describe(parsed));
    std::vector<YAML::Node> ancestors;
    size_t count = 0;
    doc->root.reset(import_tree(parsed, "", source_name, doc->lines, ancestors, count));
  }
  return Config(std::move(doc), "");
}

Config::Doc& Config::mutable_doc() {
  if (doc_.use_count() > 1) {
    auto fresh = std::make_shared<Doc>(*doc_);
    fresh->root.reset(yaml::copy(doc_->root));  // reset: Node::operator= would write through
    doc_ = std::move(fresh);
  }
  return *doc_;
}

std::string Config::full_key(const std::string& key) const { return yaml::join_key(prefix_, key); }

const std::string& Config::source() const { return doc_->source; }

bool Config::resolved() const { return doc_->resolved; }

std::string Config::where(const std::string& key) const {
  std::string full = full_key(key);
  // The most specific override at or above the key wins (a later override of a parent map
  // erased the entries below it).
  std::vector<std::string> parts = yaml::split_key(full);
  for (size_t n = parts.size(); n > 0; --n) {
    std::string k = join(std::vector<std::string>(parts.begin(), parts.begin() + n), ".");
    auto it = doc_->overrides.find(k);
    if (it != doc_->overrides.end()) return "override '" + it->second + "'";
  }
  auto line = doc_->lines.find(full);
  if (line != doc_->lines.end()) return doc_->source + ":" + std::to_string(line->second);
  // A map that only an override created ("optimzer.lr=1" creates optimzer).
  for (const auto& [k, arg] : doc_->overrides)
    if (starts_with(k, full + ".")) return "override '" + arg + "'";
  return doc_->source;
}

YAML::Node Config::node(const std::string& key) const {
  return yaml::find(doc_->root, full_key(key));
}

YAML::Node Config::value(const std::string& key) const {
  YAML::Node n = node(key);
  if (!n.IsDefined() || doc_->resolved) return n;
  if (n.IsScalar() && !has_interpolation(n.Scalar())) return n;
  return interpolate(doc_->root, full_key(key), n,
                     [this](const std::string& k) { return Config(doc_, "").where(k); });
}

void Config::type_error(const std::string& key, const char* expected, const YAML::Node& got) const {
  throw Error("config key '" + full_key(key) + "' must be " + expected + ", got " +
              yaml::describe(got) + " (" + where(key) + ")");
}

std::optional<std::string> Config::scalar(const std::string& key, const char* expected) const {
  YAML::Node n = value(key);
  if (yaml::absent(n)) return std::nullopt;
  if (!n.IsScalar()) type_error(key, expected, n);
  return n.Scalar();
}

namespace {
[[noreturn]] void missing(const Config& c, const std::string& key, const char* expected) {
  throw Error("config key '" + c.full_key(key) + "' (" + expected + ") is required but missing (" +
              c.where(key) + ")");
}
}  // namespace

bool Config::has(const std::string& key) const { return !yaml::absent(value(key)); }

std::string Config::str(const std::string& key) const {
  auto s = scalar(key, "a string");
  if (!s) missing(*this, key, "a string");
  return *s;
}

std::string Config::str(const std::string& key, const std::string& def) const {
  auto s = scalar(key, "a string");
  return s ? *s : def;
}

int64_t Config::i64(const std::string& key) const {
  auto v = opt_i64(key);
  if (!v) missing(*this, key, "an integer");
  return *v;
}

int64_t Config::i64(const std::string& key, int64_t def) const {
  auto v = opt_i64(key);
  return v ? *v : def;
}

std::optional<int64_t> Config::opt_i64(const std::string& key) const {
  auto s = scalar(key, "an integer");
  if (!s) return std::nullopt;
  auto v = parse_int(*s);
  if (!v) type_error(key, "an integer", value(key));
  return v;
}

double Config::f64(const std::string& key) const {
  auto v = opt_f64(key);
  if (!v) missing(*this, key, "a number");
  return *v;
}

double Config::f64(const std::string& key, double def) const {
  auto v = opt_f64(key);
  return v ? *v : def;
}

std::optional<double> Config::opt_f64(const std::string& key) const {
  auto s = scalar(key, "a number");
  if (!s) return std::nullopt;
  auto v = parse_float(*s);
  if (!v) type_error(key, "a number", value(key));
  return v;
}

bool Config::boolean(const std::string& key) const {
  auto s = scalar(key, "true or false");
  if (!s) missing(*this, key, "true or false");
  auto v = parse_bool(*s);
  if (!v) type_error(key, "true or false", value(key));
  return *v;
}

bool Config::boolean(const std::string& key, bool def) const {
  return has(key) ? boolean(key) : def;
}

int64_t Config::bytes(const std::string& key) const {
  auto s = scalar(key, "a byte size");
  if (!s) missing(*this, key, "a byte size");
  auto v = parse_byte_size(*s);
  if (!v)
    type_error(key, "a byte size (an integer, or text like \"5GB\" or \"512MiB\")", value(key));
  return *v;
}

int64_t Config::bytes(const std::string& key, int64_t def) const {
  return has(key) ? bytes(key) : def;
}

std::vector<std::string> Config::str_list(const std::string& key) const {
  YAML::Node n = value(key);
  if (yaml::absent(n)) missing(*this, key, "a list");
  if (!n.IsSequence()) type_error(key, "a list", n);
  std::vector<std::string> out;
  for (size_t i = 0; i < n.size(); ++i) {
    if (!n[i].IsScalar()) type_error(key, "a list of single values", n);
    out.push_back(n[i].Scalar());
  }
  return out;
}

std::vector<std::string> Config::str_list(const std::string& key,
                                          const std::vector<std::string>& def) const {
  return has(key) ? str_list(key) : def;
}

std::vector<double> Config::f64_list(const std::string& key) const {
  std::vector<double> out;
  for (const auto& s : str_list(key)) {
    auto v = parse_float(s);
    if (!v) type_error(key, "a list of numbers", value(key));
    out.push_back(*v);
  }
  return out;
}

bool Config::is_map(const std::string& key) const { return value(key).IsMap(); }

bool Config::is_list(const std::string& key) const { return value(key).IsSequence(); }

Config Config::sub(const std::string& key) const {
  YAML::Node n = node(key);
  if (yaml::absent(n)) missing(*this, key, "a map");
  if (!n.IsMap()) {
    // A map that arrives through `${...}` before resolve(): view a resolved copy.
    if (!doc_->resolved && n.IsScalar() && has_interpolation(n.Scalar())) {
      YAML::Node v = value(key);
      if (!v.IsMap()) type_error(key, "a map", v);
      Config copy = *this;
      copy.set(key, v);
      return Config(copy.doc_, full_key(key));
    }
    type_error(key, "a map", n);
  }
  return Config(doc_, full_key(key));
}

std::vector<std::string> Config::keys() const { return yaml::keys(node()); }

std::string Config::to_yaml() const {
  YAML::Emitter out;
  out << node();
  return out.c_str();
}

void Config::set(const std::string& key, const YAML::Node& value) {
  FT_CHECK(valid_key(key), "bad config key '" + key + "'");
  Doc& doc = mutable_doc();
  std::vector<std::string> parts = yaml::split_key(full_key(key));
  YAML::Node cur = doc.root;
  std::string walked;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    walked = yaml::join_key(walked, parts[i]);
    YAML::Node next = yaml::child(cur, parts[i]);
    if (yaml::absent(next)) {
      cur[parts[i]] = YAML::Node(YAML::NodeType::Map);
      next.reset(yaml::child(cur, parts[i]));
    }
    FT_CHECK(next.IsMap(), "cannot set '" + full_key(key) + "': '" + walked + "' is " +
                               yaml::describe(next) + ", not a map (" + where(walked) + ")");
    cur.reset(next);
  }
  cur[parts.back()] = yaml::copy(value);
}

void Config::remove(const std::string& key) {
  FT_CHECK(valid_key(key), "bad config key '" + key + "'");
  std::vector<std::string> parts = yaml::split_key(full_key(key));
  std::vector<std::string> parent_parts(parts.begin(), parts.end() - 1);
  YAML::Node parent = yaml::find(doc_->root, join(parent_parts, "."));
  if (!yaml::child(parent, parts.back()).IsDefined()) {
    std::string msg = "cannot delete '" + full_key(key) + "': no such key";
    std::string near = closest_match(parts.back(), yaml::keys(parent));
    if (!near.empty())
      msg += " (did you mean '" + yaml::join_key(join(parent_parts, "."), near) + "'?)";
    throw Error(msg + " (" + doc_->source + ")");
  }
  Doc& doc = mutable_doc();
  YAML::Node p = yaml::find(doc.root, join(parent_parts, "."));
  p.remove(parts.back());
}

void Config::apply_overrides(const std::vector<std::string>& args) {
  for (const auto& arg : args) {
    if (!arg.empty() && arg[0] == '~') {
      std::string key = arg.substr(1);
      FT_CHECK(arg.find('=') == std::string::npos,
               "override '" + arg + "': '~key' deletes a key and takes no value");
      FT_CHECK(valid_key(key), "override '" + arg + "': '" + key + "' is not a config key");
      remove(key);
      std::string full = full_key(key);
      auto& ov = mutable_doc().overrides;
      for (auto it = ov.begin(); it != ov.end();)
        it = (it->first == full || starts_with(it->first, full + ".")) ? ov.erase(it)
                                                                       : std::next(it);
      continue;
    }
    std::string s = (!arg.empty() && arg[0] == '+') ? arg.substr(1) : arg;
    size_t eq = s.find('=');
    FT_CHECK(eq != std::string::npos,
             "override '" + arg + "' is not key=value (e.g. optimizer.lr=1e-4, or ~key to delete)");
    std::string key = trim(std::string_view(s).substr(0, eq));
    FT_CHECK(valid_key(key), "override '" + arg + "': '" + key +
                                 "' is not a config key (dotted names like optimizer.lr)");
    YAML::Node v = parse_override_value(arg, s.substr(eq + 1));
    // torchtune: `optimizer=torch.optim.SGD` swaps the component of a component map.
    YAML::Node existing = node(key);
    if (existing.IsMap() && yaml::child(existing, "_component_").IsDefined() && v.IsScalar())
      key += "._component_";
    try {
      set(key, v);
    } catch (const Error& e) {
      throw Error("override '" + arg + "': " + e.what());
    }
    std::string full = full_key(key);
    auto& ov = mutable_doc().overrides;
    for (auto it = ov.begin(); it != ov.end();)
      it = starts_with(it->first, full + ".") ? ov.erase(it) : std::next(it);
    ov[full] = arg;
    mutable_doc().resolved = false;
  }
}

void Config::resolve() {
  if (doc_->resolved) return;
  YAML::Node resolved(YAML::NodeType::Map);
  {
    Config whole(doc_, "");
    for (const auto& k : yaml::keys(doc_->root)) {
      resolved[k] = interpolate(doc_->root, k, yaml::child(doc_->root, k),
                                [&whole](const std::string& key) { return whole.where(key); });
    }
  }
  Doc& doc = mutable_doc();
  doc.root.reset(resolved);
  doc.resolved = true;
}

}  // namespace fusetune
