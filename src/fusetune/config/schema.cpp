#include "fusetune/config/schema.h"

#include <cmath>
#include <cstdio>

#include "fusetune/config/components.h"
#include "fusetune/config/interpolation.h"
#include "fusetune/config/scalars.h"
#include "fusetune/config/yaml_tree.h"
#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune {

// ---- building ----

namespace {
Field make_field(std::string name, unsigned kinds) {
  Field f;
  f.name = std::move(name);
  f.kinds = kinds;
  return f;
}
}  // namespace

Field Field::String(std::string name) { return make_field(std::move(name), kString); }
Field Field::Int(std::string name) { return make_field(std::move(name), kInt); }
Field Field::Float(std::string name) { return make_field(std::move(name), kFloat); }
Field Field::Bool(std::string name) { return make_field(std::move(name), kBool); }
Field Field::List(std::string name) { return make_field(std::move(name), kList); }
Field Field::Bytes(std::string name) { return make_field(std::move(name), kBytes); }

Field Field::Enum(std::string name, std::vector<std::string> values) {
  Field f = make_field(std::move(name), kString);
  for (const auto& v : values)
    if (parse_bool(v)) f.kinds |= kBool;  // `compile: False` is the YAML boolean
  f.allowed = std::move(values);
  return f;
}

Field Field::Map(std::string name, std::vector<Field> fields) {
  Field f = make_field(std::move(name), kMap);
  f.fields = std::move(fields);
  return f;
}

Field Field::Section(std::string name, std::vector<Field> common,
                     std::vector<Component> components) {
  Field f = Map(std::move(name), std::move(common));
  f.components = std::move(components);
  return f;
}

Field& Field::add(Field f) {
  for (auto& existing : fields) {
    if (existing.name == f.name) {
      existing = std::move(f);
      return *this;
    }
  }
  fields.push_back(std::move(f));
  return *this;
}

Field* Field::find(const std::string& key) {
  for (auto& f : fields)
    if (f.name == key) return &f;
  return nullptr;
}

const Field* Field::find(const std::string& key) const {
  return const_cast<Field*>(this)->find(key);
}

Component* Field::component(const std::string& value) {
  for (auto& c : components)
    if (c.matches(value)) return &c;
  return nullptr;
}

const Component* Field::component(const std::string& value) const {
  return const_cast<Field*>(this)->component(value);
}

Schema& Schema::add(Field f) {
  for (auto& existing : fields) {
    if (existing.name == f.name) {
      existing = std::move(f);
      return *this;
    }
  }
  fields.push_back(std::move(f));
  return *this;
}

Field& Schema::field(const std::string& dotted) {
  std::vector<std::string> parts = yaml::split_key(dotted);
  FT_CHECK(!parts.empty(), "empty schema key");
  Field* cur = nullptr;
  for (auto& f : fields)
    if (f.name == parts[0]) cur = &f;
  for (size_t i = 1; cur && i < parts.size(); ++i) cur = cur->find(parts[i]);
  FT_CHECK(cur, "schema for recipe '" + recipe + "' has no key '" + dotted + "'");
  return *cur;
}

const Field& Schema::field(const std::string& dotted) const {
  return const_cast<Schema*>(this)->field(dotted);
}

namespace {

void collect_paths(const Field& f, const std::string& prefix, std::vector<std::string>& out) {
  std::string path = yaml::join_key(prefix, f.name);
  out.push_back(path);
  if (!f.components.empty()) out.push_back(path + "._component_");
  for (const auto& c : f.fields) collect_paths(c, path, out);
  for (const auto& comp : f.components)
    for (const auto& c : comp.fields) {
      std::vector<std::string> sub;
      collect_paths(c, path, sub);
      for (auto& s : sub)
        if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
    }
}

}  // namespace

std::vector<std::string> Schema::key_paths() const {
  std::vector<std::string> out;
  for (const auto& f : fields) collect_paths(f, "", out);
  return out;
}

// ---- validating ----

namespace {

std::string fmt_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string expected_text(unsigned kinds) {
  std::vector<std::string> parts;
  if (kinds & kString) parts.push_back("a string");
  if (kinds & kInt) parts.push_back("an integer");
  if (kinds & kFloat) parts.push_back("a number");
  if (kinds & kBool) parts.push_back("true or false");
  if (kinds & kBytes) parts.push_back("a byte size (an integer, or text like \"5GB\")");
  if (kinds & kList) parts.push_back("a list");
  if (kinds & kMap) parts.push_back("a map");
  return join(parts, " or ");
}

bool scalar_fits(const std::string& text, unsigned kinds) {
  if (kinds & kString) return true;
  if ((kinds & kInt) && parse_int(text)) return true;
  if ((kinds & kFloat) && parse_float(text)) return true;
  if ((kinds & kBool) && parse_bool(text)) return true;
  if ((kinds & kBytes) && parse_byte_size(text)) return true;
  return false;
}

// A scalar as compared with `allowed`: booleans spelled true/false.
std::string normalized(const std::string& text, unsigned kinds) {
  if (kinds & kBool) {
    if (auto b = parse_bool(text)) return *b ? "true" : "false";
  }
  return text;
}

std::string tail_of(const std::string& name) {
  size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

// The accepted name closest to an unknown one. torchtune names share long module paths, so
// names are compared by their last part ("WandBLogger" is not close to "DiskLogger").
std::string component_suggestion(const std::vector<Component>& components,
                                 const std::string& value) {
  std::vector<std::string> names, tails;
  for (const auto& c : components) {
    names.push_back(c.name);
    for (const auto& a : c.aliases) names.push_back(a);
  }
  for (const auto& n : names) tails.push_back(tail_of(n));
  std::string best = closest_match(tail_of(value), tails);
  if (best.empty()) return "";
  // Prefer the candidate spelled like the value (with or without a module path).
  bool dotted = value.find('.') != std::string::npos;
  std::string fallback;
  for (size_t i = 0; i < names.size(); ++i) {
    if (tails[i] != best) continue;
    if ((names[i].find('.') != std::string::npos) == dotted) return names[i];
    if (fallback.empty()) fallback = names[i];
  }
  return fallback;
}

std::string component_names(const Field& spec) {
  std::vector<std::string> names;
  for (const auto& c : spec.components) names.push_back(c.name);
  return join(names, ", ");
}

class Validator {
 public:
  Validator(const Config& root, Problems& p) : root_(root), p_(p) {}

  // Checks the map `node` at dotted `path` against `spec` (whose fields and components
  // describe the map's keys).
  void check_map(const std::string& path, const YAML::Node& node, const Field& spec) {
    if (spec.is_open_map()) return run_checks(path, spec);
    size_t errors_before = p_.errors.size();
    const Component* comp = nullptr;
    bool comp_known = true;
    std::vector<const Field*> valid;
    for (const auto& f : spec.fields) valid.push_back(&f);
    if (!spec.components.empty()) {
      std::string ckey = yaml::join_key(path, "_component_");
      YAML::Node c = yaml::child(node, "_component_");
      if (yaml::absent(c)) {
        if (!spec.default_component.empty()) {
          comp = spec.component(spec.default_component);
        } else {
          error("missing required key '" + ckey + "' (one of: " + component_names(spec) + ")",
                path);
          comp_known = false;
        }
      } else if (!c.IsScalar()) {
        error("config key '" + ckey + "' must be a component name, got " + yaml::describe(c), ckey);
        comp_known = false;
      } else {
        comp = spec.component(c.Scalar());
        if (!comp) {
          error(unknown_component(spec, ckey, c.Scalar()), ckey);
          comp_known = false;
        }
      }
      if (comp)
        for (const auto& f : comp->fields) valid.push_back(&f);
    }

    // Keys present but not valid here.
    for (const auto& key : yaml::keys(node)) {
      if (key == "_component_" && !spec.components.empty()) continue;
      bool ok = false;
      for (const Field* f : valid) ok = ok || f->name == key;
      if (ok || !comp_known) continue;
      std::string full = yaml::join_key(path, key);
      std::string owner;
      for (const auto& other : spec.components)
        for (const auto& f : other.fields)
          if (f.name == key && owner.empty()) owner = other.name;
      if (!owner.empty()) {
        error("config key '" + full + "' is not valid with " + path + "._component_ " + comp->name +
                  " (it belongs to " + owner + ")",
              full);
        continue;
      }
      std::vector<std::string> names;
      for (const Field* f : valid) names.push_back(f->name);
      std::string near = closest_match(key, names);
      std::string msg = "unknown config key '" + full + "'";
      if (!near.empty()) {
        msg += " (did you mean '" + yaml::join_key(path, near) + "'?)";
      } else if (!names.empty() && names.size() <= 12) {
        msg += "; valid keys" + std::string(path.empty() ? "" : " in '" + path + "'") + ": " +
               join(names, ", ");
      }
      error(msg, full);
    }

    for (const Field* f : valid)
      check_value(yaml::join_key(path, f->name), yaml::child(node, f->name), *f);
    // Cross-key checks read typed values: run them only on a map that is otherwise valid.
    if (p_.errors.size() == errors_before) run_checks(path, spec);
  }

  void run_checks(const std::string& path, const Field& spec) {
    if (spec.checks.empty()) return;
    Config section = path.empty() ? root_ : root_.sub(path);
    for (const auto& check : spec.checks) run_check(check, section);
  }

  void run_check(const Check& check, const Config& section) {
    try {
      check(section, root_, p_);
    } catch (const Error& e) {
      p_.errors.push_back(e.what());
    }
  }

 private:
  void error(const std::string& msg, const std::string& key) {
    p_.errors.push_back(msg + " (" + root_.where(key) + ")");
  }

  std::string unknown_component(const Field& spec, const std::string& ckey, const std::string& v) {
    std::string msg = "unknown " + ckey + " '" + v + "'";
    const std::vector<std::string> parts = yaml::split_key(ckey);
    const std::string why =
        parts.size() >= 2 ? not_an_alias(parts[parts.size() - 2], v) : std::string();
    std::string near = why.empty() ? component_suggestion(spec.components, v) : "";
    if (!why.empty()) msg += ": " + why;
    if (!near.empty()) msg += " (did you mean '" + near + "'?)";
    return msg + "; valid: " + component_names(spec);
  }

  void check_value(const std::string& key, const YAML::Node& v, const Field& f) {
    if (yaml::absent(v)) {
      if (f.required)
        error("missing required config key '" + key + "'" +
                  (f.help.empty() ? std::string() : " (" + f.help + ")"),
              key);
      return;
    }
    if (!f.ignored.empty())
      p_.warnings.push_back("config key '" + key + "' is ignored: " + f.ignored);
    if (v.IsScalar()) {
      if (!scalar_fits(v.Scalar(), f.kinds)) return type_error(key, f, v);
      if (!f.allowed.empty()) check_allowed(key, v.Scalar(), f.kinds, f.allowed);
      check_range(key, v.Scalar(), f);
    } else if (v.IsSequence()) {
      if (!(f.kinds & kList)) return type_error(key, f, v);
      if (f.list_size && v.size() != *f.list_size)
        error("config key '" + key + "' must be a list of " + std::to_string(*f.list_size) +
                  " items, got " + std::to_string(v.size()),
              key);
      for (size_t i = 0; i < v.size(); ++i) {
        std::string item_key = key + "[" + std::to_string(i) + "]";
        const YAML::Node& item = v[i];
        unsigned ik = f.item_kinds ? f.item_kinds : (kString | kInt | kFloat | kBool);
        if (!item.IsScalar() || !scalar_fits(item.Scalar(), ik)) {
          if (item.IsMap() && (ik & kMap)) continue;
          p_.errors.push_back("config key '" + item_key + "' must be " + expected_text(ik) +
                              ", got " + yaml::describe(item) + " (" + root_.where(key) + ")");
          continue;
        }
        if (!f.allowed.empty()) check_allowed(item_key, item.Scalar(), ik, f.allowed, key);
      }
    } else if (v.IsMap()) {
      if (!(f.kinds & kMap)) return type_error(key, f, v);
      check_map(key, v, f);
    }
  }

  void type_error(const std::string& key, const Field& f, const YAML::Node& v) {
    std::string expected = expected_text(f.kinds);
    if (!f.allowed.empty() && !(f.kinds & kList)) expected = "one of " + join(f.allowed, ", ");
    error("config key '" + key + "' must be " + expected + ", got " + yaml::describe(v), key);
  }

  void check_allowed(const std::string& key, const std::string& text, unsigned kinds,
                     const std::vector<std::string>& allowed, const std::string& where_key = "") {
    std::string n = normalized(text, kinds);
    for (const auto& a : allowed)
      if (a == n) return;
    std::string msg =
        "config key '" + key + "' must be one of " + join(allowed, ", ") + "; got '" + text + "'";
    std::string near = closest_match(n, allowed);
    if (!near.empty()) msg += " (did you mean '" + near + "'?)";
    error(msg, where_key.empty() ? key : where_key);
  }

  void check_range(const std::string& key, const std::string& text, const Field& f) {
    if (!f.min_value && !f.max_value) return;
    auto v = parse_float(text);
    if (!v) return;  // a string alternative (e.g. a byte size) is not range-checked
    if (f.min_value && !(*v >= *f.min_value))
      error("config key '" + key + "' must be >= " + fmt_number(*f.min_value) + ", got " + text,
            key);
    if (f.max_value && !(f.max_open ? *v < *f.max_value : *v <= *f.max_value))
      error("config key '" + key + "' must be " + (f.max_open ? "< " : "<= ") +
                fmt_number(*f.max_value) + ", got " + text,
            key);
  }

  const Config& root_;
  Problems& p_;
};

}  // namespace

Problems check_config(const Config& cfg, const Schema& schema) {
  Problems p;
  Config resolved = cfg;
  try {
    resolved.resolve();
  } catch (const Error& e) {
    p.errors.push_back(e.what());
    return p;  // types cannot be judged before references resolve
  }
  Field top = Field::Map("", schema.fields);
  Validator v(resolved, p);
  v.check_map(resolved.full_key(""), resolved.node(), top);
  if (p.errors.empty())
    for (const auto& check : schema.checks) v.run_check(check, resolved);
  return p;
}

void validate(const Config& cfg, const Schema& schema, std::vector<std::string>* warnings) {
  Problems p = check_config(cfg, schema);
  if (warnings) *warnings = p.warnings;
  if (p.errors.empty()) return;
  std::string msg = cfg.source() + ": " + std::to_string(p.errors.size()) +
                    (p.errors.size() == 1 ? " problem" : " problems") + " in the config" +
                    (schema.recipe.empty() ? "" : " for recipe " + schema.recipe) + ":";
  for (const auto& e : p.errors) msg += "\n  - " + e;
  throw Error(msg);
}

// ---- defaults ----

namespace {

void fill_map(Config& cfg, const std::string& path, const Field& spec);

void fill_field(Config& cfg, const std::string& key, const Field& f) {
  YAML::Node v = cfg.node(key);
  if (yaml::absent(v)) {
    if (f.default_yaml.empty()) return;
    // Defaults may refer to other keys ("${output_dir}/logs"); one whose reference is absent
    // (a recipe without output_dir, like generate) is left unset.
    YAML::Node def;
    try {
      def = interpolate(cfg.node(), key, YAML::Load(f.default_yaml),
                        [&cfg](const std::string& k) { return cfg.where(k); });
    } catch (const Error&) {
      return;
    }
    cfg.set(key, def);
    v.reset(cfg.node(key));
  }
  if (v.IsScalar() && (f.kinds & kBool)) {
    if (auto b = parse_bool(v.Scalar())) {
      if (v.Scalar() != (*b ? "true" : "false")) cfg.set(key, YAML::Node(*b ? "true" : "false"));
    }
  }
  if (v.IsMap() && !f.is_open_map()) fill_map(cfg, key, f);
}

void fill_map(Config& cfg, const std::string& path, const Field& spec) {
  for (const auto& f : spec.fields) fill_field(cfg, yaml::join_key(path, f.name), f);
  if (spec.components.empty()) return;
  std::string ckey = yaml::join_key(path, "_component_");
  std::string chosen = cfg.has(ckey) ? cfg.str(ckey) : spec.default_component;
  const Component* comp = spec.component(chosen);
  FT_CHECK(comp, "unknown " + ckey + " '" + chosen + "' (validate the config first)");
  if (!cfg.has(ckey) || cfg.str(ckey) != comp->name) cfg.set(ckey, YAML::Node(comp->name));
  for (const auto& f : comp->fields) fill_field(cfg, yaml::join_key(path, f.name), f);
}

}  // namespace

Config with_defaults(const Config& cfg, const Schema& schema) {
  Config out = cfg;
  out.resolve();
  fill_map(out, "", Field::Map("", schema.fields));
  return out;
}

std::string canonical_component(const Config& cfg, const std::string& key) {
  std::vector<std::string> parts = yaml::split_key(cfg.full_key(key));
  FT_CHECK(!parts.empty(), "canonical_component needs a key");
  const ComponentTable* table = component_table(parts.back());
  FT_CHECK(table, "config key '" + cfg.full_key(key) + "' does not select a component");
  std::string ckey = yaml::join_key(key, "_component_");
  std::string value = cfg.has(ckey) ? cfg.str(ckey) : table->default_component;
  if (value.empty()) cfg.str(ckey);  // throws: required but missing
  for (const auto& c : table->components)
    if (c.matches(value)) return c.name;
  std::string msg = "unknown " + cfg.full_key(ckey) + " '" + value + "'";
  const std::string why = not_an_alias(parts.back(), value);
  std::string near = why.empty() ? component_suggestion(table->components, value) : "";
  if (!why.empty()) msg += ": " + why;
  if (!near.empty()) msg += " (did you mean '" + near + "'?)";
  throw Error(msg + " (" + cfg.where(ckey) + ")");
}

}  // namespace fusetune
