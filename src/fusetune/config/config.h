#pragma once
// A recipe config: a YAML map read from a file (or a built-in config), changed by command-line
// `key=value` overrides, with OmegaConf-style `${...}` interpolation, read through typed,
// dotted-key accessors whose errors name the key, the expected type and where the value came
// from (file and line, or the override that set it).
//
// Lifecycle, as `fusetune run` uses it:
//   Config cfg = Config::from_file("my.yaml");    // parse errors name file and line
//   cfg.apply_overrides({"optimizer.lr=1e-4", "~profiler"});
//   cfg.resolve();                                // ${...} after overrides, as torchtune does
//   double lr = cfg.f64("optimizer.lr");
// Accessors also resolve `${...}` on the fly when resolve() was not called.
//
// Paths: a relative path in a config is relative to the directory fusetune runs in (as in
// torchtune), never to the config file's folder, so `fusetune cp` never changes its meaning.
//
// Values: every YAML scalar is text until read; `null` / `~` / an empty value count as absent.
// A Config copy is independent (copy-on-write); `sub(key)` is a view of a map inside it.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

namespace fusetune {

class Config {
 public:
  Config();  // an empty map named "<empty>"

  // Parses a YAML map. Errors (bad YAML, duplicate keys, a top level that is not a map) name
  // the file and line. `source_name` is what error messages call the text.
  static Config from_file(const std::string& path);
  static Config from_string(const std::string& text, const std::string& source_name);

  // Applies command-line overrides in order:
  //   key.sub=value   sets (creating maps on the way); value is YAML: 1e-4, [q_proj,v_proj],
  //                   {a: 1}, null. Text with ": " that does not start with '{' stays a string.
  //   +key=value      the same (Hydra spelling)
  //   ~key            deletes the key (an error when absent)
  //   key=NAME        where key is a map with `_component_`: sets key._component_ (torchtune)
  // A malformed override is an error naming it.
  void apply_overrides(const std::vector<std::string>& args);

  // Replaces every `${...}` in the tree. Forms: `${a.b}` (absolute key), `${.b}` (a sibling),
  // `${..b}` (the parent's sibling), `${oc.env:NAME}` / `${oc.env:NAME,default}`. A value
  // that is exactly one `${key}` takes the referenced value whole (a number, list or map);
  // otherwise references are spliced into the text. `\${` is a literal `${`. Unknown keys,
  // unset environment variables and cycles are errors naming the key that refers to them.
  void resolve();

  // Typed access by dotted key ("optimizer.lr"), relative to this view. A missing (or null)
  // key, or a value of the wrong type, is an Error naming the key, the expected type and the
  // source. The overloads with a default return it when the key is absent, but a present
  // value of the wrong type is still an error.
  bool has(const std::string& key) const;
  std::string str(const std::string& key) const;
  std::string str(const std::string& key, const std::string& def) const;
  int64_t i64(const std::string& key) const;
  int64_t i64(const std::string& key, int64_t def) const;
  double f64(const std::string& key) const;
  double f64(const std::string& key, double def) const;
  bool boolean(const std::string& key) const;
  bool boolean(const std::string& key, bool def) const;
  std::vector<std::string> str_list(const std::string& key) const;
  std::vector<std::string> str_list(const std::string& key,
                                    const std::vector<std::string>& def) const;
  std::vector<double> f64_list(const std::string& key) const;
  // For "int or null" keys such as max_steps_per_epoch.
  std::optional<int64_t> opt_i64(const std::string& key) const;
  std::optional<double> opt_f64(const std::string& key) const;
  // A byte count: an integer, or text like "5GB" (10^9), "512MiB" (2^20), as in HF's
  // max_shard_size.
  int64_t bytes(const std::string& key) const;
  int64_t bytes(const std::string& key, int64_t def) const;

  // A view of the map at `key` (an error when absent or not a map). Keys and error messages
  // of the view keep the full dotted path.
  Config sub(const std::string& key) const;
  bool is_map(const std::string& key) const;
  bool is_list(const std::string& key) const;
  // Keys of this view's map, in file order.
  std::vector<std::string> keys() const;
  // This view as YAML text (resolved only if resolve() was called).
  std::string to_yaml() const;

  // Sets / removes one key (dotted, relative to this view); used by defaults and tests.
  void set(const std::string& key, const YAML::Node& value);
  void remove(const std::string& key);

  // The raw node at `key` ("" = this view); undefined when absent. For code that walks the
  // tree (validation); typed accessors are the normal way in.
  YAML::Node node(const std::string& key = "") const;
  // The full dotted key of `key` in this view ("optimizer" + "lr" -> "optimizer.lr").
  std::string full_key(const std::string& key) const;
  // Where a key's value came from, for messages: "configs/x.yaml:12", "override 'lr=1'", or
  // the source name.
  std::string where(const std::string& key) const;
  const std::string& source() const;
  bool resolved() const;

 private:
  struct Doc;
  Config(std::shared_ptr<Doc> doc, std::string prefix);
  Doc& mutable_doc();
  // The value at key with `${...}` resolved when the doc is not yet resolved; undefined node
  // when absent.
  YAML::Node value(const std::string& key) const;
  // The scalar at key, or nullopt when absent/null; wrong kinds throw naming `expected`.
  std::optional<std::string> scalar(const std::string& key, const char* expected) const;
  [[noreturn]] void type_error(const std::string& key, const char* expected,
                               const YAML::Node& got) const;

  std::shared_ptr<Doc> doc_;
  std::string prefix_;  // dotted path of this view in doc_->root ("" = the whole config)
};

}  // namespace fusetune
