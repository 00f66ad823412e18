#include "fusetune/config/interpolation.h"

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "fusetune/config/yaml_tree.h"
#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune {
namespace {

using WhereFn = std::function<std::string(const std::string&)>;

// One resolution in progress: the chain of keys being resolved, to report cycles.
struct Resolver {
  const YAML::Node& root;
  const WhereFn& where;
  std::vector<std::string> stack;
  size_t nodes = 0;  // values produced, bounded so references of references cannot explode

  void count(const std::string& key) {
    FT_CHECK(
        ++nodes <= 10'000,
        "config key '" + key + "' interpolates to more than 10000 values (" + where(key) + ")");
  }

  // `key`: the full dotted key of `value` (list items get "key[i]"); `container`: the dotted
  // path of the map that holds it, the base of relative references.
  YAML::Node resolve(const std::string& key, const std::string& container,
                     const YAML::Node& value) {
    count(key);
    switch (value.Type()) {
      case YAML::NodeType::Scalar:
        return resolve_scalar(key, container, value);
      case YAML::NodeType::Sequence: {
        YAML::Node out(YAML::NodeType::Sequence);
        for (size_t i = 0; i < value.size(); ++i)
          out.push_back(resolve(key + "[" + std::to_string(i) + "]", container, value[i]));
        out.SetStyle(value.Style());
        return out;
      }
      case YAML::NodeType::Map: {
        YAML::Node out(YAML::NodeType::Map);
        for (auto it = value.begin(); it != value.end(); ++it) {
          const std::string& k = it->first.Scalar();
          out[k] = resolve(yaml::join_key(key, k), key, it->second);
        }
        out.SetStyle(value.Style());
        return out;
      }
      default:
        return yaml::copy(value);
    }
  }

  YAML::Node resolve_scalar(const std::string& key, const std::string& container,
                            const YAML::Node& value) {
    const std::string& text = value.Scalar();
    if (text.find("${") == std::string::npos) return yaml::copy(value);
    std::string out;
    for (size_t i = 0; i < text.size();) {
      if (text.compare(i, 3, "\\${") == 0) {
        out += "${";
        i += 3;
        continue;
      }
      if (text.compare(i, 2, "${") != 0) {
        out += text[i++];
        continue;
      }
      size_t close = text.find('}', i + 2);
      FT_CHECK(close != std::string::npos, "config key '" + key +
                                               "' has an unterminated '${' in '" + text + "' (" +
                                               where(key) + ")");
      std::string expr = trim(std::string_view(text).substr(i + 2, close - i - 2));
      FT_CHECK(expr.find("${") == std::string::npos, "config key '" + key +
                                                         "': nested interpolation '" + text +
                                                         "' is not supported (" + where(key) + ")");
      YAML::Node ref = reference(key, container, expr);
      // A value that is exactly one reference takes the referenced value whole (its type too).
      if (i == 0 && close + 1 == text.size()) return ref;
      FT_CHECK(ref.IsScalar(), "config key '" + key + "' splices '${" + expr +
                                   "}' into text, but it is " + yaml::describe(ref) +
                                   ", not a single value (" + where(key) + ")");
      out += ref.Scalar();
      // Guards against references that double in size at each level.
      FT_CHECK(
          out.size() <= (1u << 20),
          "config key '" + key + "' interpolates to more than 1 MiB of text (" + where(key) + ")");
      i = close + 1;
    }
    return YAML::Node(out);
  }

  // The resolved value of one `${expr}` used by `key`.
  YAML::Node reference(const std::string& key, const std::string& container,
                       const std::string& expr) {
    size_t colon = expr.find(':');
    if (colon != std::string::npos) return resolver_call(key, expr, colon);
    FT_CHECK(!expr.empty(), "config key '" + key + "' has an empty '${}' (" + where(key) + ")");
    std::string target = expr;
    if (expr[0] == '.') {
      // ${.x}: a sibling of key; each further dot climbs one map up.
      size_t dots = expr.find_first_not_of('.');
      FT_CHECK(dots != std::string::npos, "config key '" + key + "' has a bad reference '${" +
                                              expr + "}' (" + where(key) + ")");
      std::vector<std::string> base = yaml::split_key(container);
      FT_CHECK(dots - 1 <= base.size(), "config key '" + key + "' refers to '${" + expr +
                                            "}', which climbs above the top of the config (" +
                                            where(key) + ")");
      base.resize(base.size() - (dots - 1));
      target = yaml::join_key(join(base, "."), expr.substr(dots));
    }
    if (std::find(stack.begin(), stack.end(), target) != stack.end()) {
      std::vector<std::string> cycle(std::find(stack.begin(), stack.end(), target), stack.end());
      cycle.push_back(target);
      throw Error("config interpolation cycle: " + join(cycle, " -> ") + " (" + where(key) + ")");
    }
    YAML::Node node = locate(key, expr, target);
    stack.push_back(target);
    std::vector<std::string> parts = yaml::split_key(target);
    parts.pop_back();
    YAML::Node resolved = resolve(target, join(parts, "."), node);
    stack.pop_back();
    return resolved;
  }

  // The node at `target`, or an error naming the closest existing key.
  YAML::Node locate(const std::string& key, const std::string& expr, const std::string& target) {
    YAML::Node cur = root;
    std::string walked;
    for (const auto& part : yaml::split_key(target)) {
      YAML::Node next = yaml::child(cur, part);
      if (!next.IsDefined()) {
        std::string msg = "config key '" + key + "' refers to '${" + expr + "}', but '" + target +
                          "' does not exist";
        std::string near = closest_match(part, yaml::keys(cur));
        if (!near.empty()) msg += " (did you mean '" + yaml::join_key(walked, near) + "'?)";
        throw Error(msg + " (" + where(key) + ")");
      }
      cur.reset(next);
      walked = yaml::join_key(walked, part);
    }
    return cur;
  }

  // `${name:args}`: only OmegaConf's oc.env is supported.
  YAML::Node resolver_call(const std::string& key, const std::string& expr, size_t colon) {
    std::string name = trim(std::string_view(expr).substr(0, colon));
    std::string args = std::string(expr.substr(colon + 1));
    FT_CHECK(name == "oc.env" || name == "env",
             "config key '" + key + "' uses the resolver '" + name + "' in '${" + expr +
                 "}'; fusetune supports only oc.env (" + where(key) + ")");
    size_t comma = args.find(',');
    std::string var = trim(std::string_view(args).substr(0, comma));
    FT_CHECK(!var.empty(), "config key '" + key + "': '${" + expr +
                               "}' names no environment variable (" + where(key) + ")");
    if (const char* v = std::getenv(var.c_str())) return YAML::Node(std::string(v));
    FT_CHECK(comma != std::string::npos, "config key '" + key +
                                             "' refers to the environment variable " + var +
                                             ", which is not set (" + where(key) + ")");
    std::string def = trim(std::string_view(args).substr(comma + 1));
    if (def == "null") return YAML::Node(YAML::NodeType::Null);
    if (def.size() >= 2 && (def.front() == '\'' || def.front() == '"') && def.back() == def.front())
      def = def.substr(1, def.size() - 2);
    return YAML::Node(def);
  }
};

}  // namespace

bool has_interpolation(const std::string& text) { return text.find("${") != std::string::npos; }

YAML::Node interpolate(const YAML::Node& root, const std::string& key, const YAML::Node& value,
                       const std::function<std::string(const std::string&)>& where) {
  Resolver r{root, where, {key}, 0};
  std::vector<std::string> parts = yaml::split_key(key);
  if (!parts.empty()) parts.pop_back();
  return r.resolve(key, join(parts, "."), value);
}

}  // namespace fusetune
