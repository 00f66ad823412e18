#pragma once
// A declarative schema of the keys a recipe reads, and validation that reports every problem
// of a config in one error: unknown keys (with "did you mean"), wrong types, missing required
// keys, values outside an allowed set or range.
//
// A map may select a *component* with `_component_` (as in torchtune); the component decides
// which sibling keys are valid. torchtune's component names are aliases of fusetune's, so a
// pasted torchtune config validates: `torch.optim.AdamW` is `AdamW`.
//
// Schemas are built with chained setters and are easy to extend:
//   Schema s = full_finetune_schema();                        // a copy
//   s.field("model").add(Field::Int("lora_rank").def("8").min(1));
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fusetune/config/config.h"

namespace fusetune {

// What a value may be; a Field allows any combination (e.g. kInt | kString for a byte size).
enum Kind : unsigned {
  kString = 1u << 0,
  kInt = 1u << 1,
  kFloat = 1u << 2,  // also accepts integers
  kBool = 1u << 3,
  kList = 1u << 4,
  kMap = 1u << 5,
  kBytes = 1u << 6,  // an integer or "5GB"-style text (Config::bytes)
};

// Problems found while validating; checks append to it.
struct Problems {
  std::vector<std::string> errors;
  std::vector<std::string> warnings;
};

struct Field;

// One choice of a `_component_` key.
struct Component {
  std::string name;                  // fusetune's canonical name, e.g. "AdamW"
  std::vector<std::string> aliases;  // other accepted names, e.g. "torch.optim.AdamW"
  std::string help;
  std::vector<Field> fields;  // keys valid (besides the map's common ones) with this choice

  // (Two constructors rather than a default argument: Field is incomplete here, and clang
  // instantiates a defaulted std::vector<Field> argument at the declaration.)
  Component(std::string name, std::vector<std::string> aliases, std::string help);
  Component(std::string name, std::vector<std::string> aliases, std::string help,
            std::vector<Field> fields);
  bool matches(const std::string& value) const;
};

// A check over a whole map (cross-key rules); `section` is the map's view, `root` the config.
using Check = std::function<void(const Config& section, const Config& root, Problems&)>;

struct Field {
  std::string name;
  unsigned kinds = kString;
  bool required = false;
  std::string default_yaml;  // "" = no default; YAML text otherwise
  std::string help;
  std::vector<std::string> allowed;  // allowed values (booleans spelled true/false); for a
                                     // list, allowed values of its items
  unsigned item_kinds = 0;           // for a list: the kinds of its items (0 = any scalar)
  std::optional<size_t> list_size;   // for a list: exact length
  std::optional<double> min_value, max_value;  // for numbers (max exclusive if max_open)
  bool max_open = false;
  // For a map: its keys (kMap alone with no fields and no components = an open map whose
  // keys are not checked).
  std::vector<Field> fields;
  std::vector<Component> components;  // non-empty: `_component_` selects one
  std::string default_component;      // used when `_component_` is absent ("" = required)
  std::vector<Check> checks;
  std::string ignored;  // non-empty: accepted, but a warning with this text when set

  // Constructors for each kind.
  static Field String(std::string name);
  static Field Int(std::string name);
  static Field Float(std::string name);
  static Field Bool(std::string name);
  static Field List(std::string name);
  static Field Bytes(std::string name);
  static Field Enum(std::string name, std::vector<std::string> values);
  static Field Map(std::string name, std::vector<Field> fields = {});  // no fields: open map
  static Field Section(std::string name, std::vector<Field> common,
                       std::vector<Component> components);

  // Chained setters.
  // clang-format off
  Field& req() { required = true; return *this; }
  Field& def(std::string yaml_text) { default_yaml = std::move(yaml_text); return *this; }
  Field& doc(std::string text) { help = std::move(text); return *this; }
  Field& also(unsigned k) { kinds |= k; return *this; }
  Field& items(unsigned k) { item_kinds = k; return *this; }
  Field& size(size_t n) { list_size = n; return *this; }
  Field& min(double v) { min_value = v; return *this; }
  Field& max(double v, bool open = false) { max_value = v; max_open = open; return *this; }
  Field& values(std::vector<std::string> v) { allowed = std::move(v); return *this; }
  Field& check(Check c) { checks.push_back(std::move(c)); return *this; }
  Field& ignore(std::string why) { ignored = std::move(why); return *this; }
  Field& default_comp(std::string c) { default_component = std::move(c); return *this; }
  // clang-format on
  Field& add(Field f);

  // The field named `name` among this map's keys (the common ones, not a component's), or
  // nullptr.
  Field* find(const std::string& name);
  const Field* find(const std::string& name) const;
  // The component `value` names (canonical or alias), or nullptr.
  const Component* component(const std::string& value) const;
  Component* component(const std::string& value);
  bool is_open_map() const { return (kinds & kMap) && fields.empty() && components.empty(); }
};

struct Schema {
  std::string recipe;
  std::vector<Field> fields;
  std::vector<Check> checks;  // over the whole config

  Schema& add(Field f);
  // The field at a dotted path through maps ("optimizer", "model.lora_rank"), or an Error.
  Field& field(const std::string& dotted);
  const Field& field(const std::string& dotted) const;
  // Every valid dotted key, for listings and tests ("optimizer.lr" once per component).
  std::vector<std::string> key_paths() const;
};

// Validates a config (resolving `${...}` on a copy first if needed). Throws one Error listing
// every problem:  "<source>: N problems:\n  - ...". Warnings (ignored keys) go to `warnings`
// when given.
void validate(const Config& cfg, const Schema& schema,
              std::vector<std::string>* warnings = nullptr);
// The same, returning the problems instead of throwing.
Problems check_config(const Config& cfg, const Schema& schema);

// The config a recipe runs with: resolved, schema defaults filled in where keys are absent
// (also inside present maps, and maps with a default such as `loss`), booleans written
// true/false, and each `_component_` replaced by fusetune's canonical name. Call after
// validate().
Config with_defaults(const Config& cfg, const Schema& schema);

// The canonical fusetune name of the component at `key` (`cfg.str(key + "._component_")`,
// or the map's default component), looked up in the built-in component tables
// (config/components.h) by the last part of `key` ("optimizer", "dataset", ...). Unknown
// names are an Error with the closest suggestion.
std::string canonical_component(const Config& cfg, const std::string& key);

}  // namespace fusetune
