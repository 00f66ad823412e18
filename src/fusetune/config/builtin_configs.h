#pragma once
// The configs shipped in configs/<family>/<name>.yaml, embedded in the binary, and the one
// way the CLI turns a --config argument into a Config.
#include <string>
#include <string_view>
#include <vector>

#include "fusetune/config/config.h"

namespace fusetune {

struct BuiltinConfig {
  std::string name;       // "llama3_2/1B_full_single_device"
  std::string recipe;     // from its "# recipe: NAME" comment line ("" when none)
  std::string_view text;  // the file as written, comments included (what `fusetune cp` copies)
};

// All built-in configs, sorted by name.
const std::vector<BuiltinConfig>& builtin_configs();
// The built-in config with this exact name, or nullptr.
const BuiltinConfig* find_builtin_config(const std::string& name);

// A --config argument: a built-in name ("llama3_2/1B_full_single_device") or a YAML file
// path. A built-in name wins over a file of the same relative path without ".yaml". Neither
// -> an Error with the closest built-in name. Not yet overridden or resolved.
Config load_config(const std::string& name_or_path);
// Folders that may hold torchtune's own configs (<family>/<name>.yaml), in the order looked at:
// $FUSETUNE_ASSETS/torchtune_configs, then ../shared/assets/torchtune_configs relative to the
// current directory. Only existing folders are listed. fusetune does not embed these files.
std::vector<std::string> torchtune_config_dirs();
// The file of torchtune's config `name` ("llama3_2/1B_lora_single_device", ".yaml" optional)
// in the first folder holding it, or "" when none does.
std::string find_torchtune_config(const std::string& name);
// The names of torchtune's configs found in those folders, sorted, without duplicates.
std::vector<std::string> torchtune_config_names();

// The text of a --config argument as written, comments included: the built-in config's, else
// the file's ("" when it cannot be read). For the header comments load_config drops.
std::string config_text(const std::string& name_or_path);
// The recipe a config names in its "# recipe: NAME" comment line ("" when none).
std::string recipe_comment(std::string_view yaml_text);

}  // namespace fusetune
