// fusetune cp CONFIG DEST: writes a built-in config (or one of torchtune's, from the assets
// folder), comments included, to a file to edit.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "fusetune/cli/args.h"
#include "fusetune/cli/command.h"
#include "fusetune/config/builtin_configs.h"
#include "fusetune/data/hub_datasets.h"
#include "fusetune/recipes/recipe_inference.h"
#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune::cli {

namespace fs = std::filesystem;

const char* const kCpHelp =
    "usage: fusetune cp CONFIG DEST [--force] [--make-parents]\n"
    "\n"
    "Copies the built-in config CONFIG (see `fusetune ls`) to DEST. Without a built-in config\n"
    "of that name, CONFIG may be one of torchtune's (llama3_1/8B_qlora_single_device), read\n"
    "from $FUSETUNE_ASSETS/torchtune_configs or ../shared/assets/torchtune_configs; when its\n"
    "`tune run` recipe is one fusetune does not have yet, cp says so. DEST may be a directory\n"
    "(the file keeps its name); without an extension, .yaml is added. An existing file is\n"
    "not overwritten unless --force is given; --make-parents creates missing directories.\n";

int cmd_cp(const std::vector<std::string>& argv) {
  Args a = parse_args(argv, {{}, {"force", "make-parents"}, false});
  FT_CHECK(a.positional.size() == 2, "usage: fusetune cp CONFIG DEST [--force] [--make-parents]");
  const std::string& name = a.positional[0];
  std::string stem = name;
  if (stem.size() > 5 && stem.compare(stem.size() - 5, 5, ".yaml") == 0)
    stem.resize(stem.size() - 5);
  const BuiltinConfig* cfg = find_builtin_config(stem);
  // Else one of torchtune's configs, read from the assets folder (never embedded).
  std::string torchtune_file, text;
  if (!cfg) torchtune_file = find_torchtune_config(stem);
  if (!cfg && torchtune_file.empty()) {
    std::vector<std::string> names;
    for (const auto& c : builtin_configs()) names.push_back(c.name);
    for (const auto& n : torchtune_config_names()) names.push_back(n);
    std::string msg = "no built-in config '" + name + "'";
    std::string near = closest_match(stem, names);
    if (!near.empty()) msg += " (did you mean '" + near + "'?)";
    msg += "; `fusetune ls` lists them";
    const std::vector<std::string> dirs = torchtune_config_dirs();
    if (dirs.empty())
      msg +=
          "; torchtune's configs are read from $FUSETUNE_ASSETS/torchtune_configs or "
          "../shared/assets/torchtune_configs, and neither exists here";
    else
      msg += ", nor is it one of torchtune's configs in " + join(dirs, ", ");
    throw Error(msg);
  }
  if (cfg) {
    text = std::string(cfg->text);
  } else {
    text = config_text(torchtune_file);
    FT_CHECK(!text.empty(), "cannot read '" + torchtune_file + "'");
  }
  const std::string filename = fs::path(cfg ? cfg->name : stem).filename().string();

  fs::path dest = a.positional[1];
  std::error_code ec;
  if (fs::is_directory(dest, ec))
    dest /= filename + ".yaml";
  else if (!dest.has_extension())
    dest += ".yaml";
  FT_CHECK(!fs::is_directory(dest, ec),
           "cannot copy to '" + dest.string() + "': it is a directory");
  if (fs::exists(dest, ec) && !a.flag("force"))
    throw Error("'" + dest.string() + "' already exists; pass --force to overwrite it");
  fs::path parent = dest.parent_path();
  if (!parent.empty() && !fs::exists(parent, ec)) {
    FT_CHECK(a.flag("make-parents"), "cannot copy to '" + dest.string() + "': directory '" +
                                         parent.string() +
                                         "' does not exist (pass --make-parents to create it)");
    fs::create_directories(parent, ec);
    FT_CHECK(!ec, "cannot create directory '" + parent.string() + "': " + ec.message());
  }
  std::ofstream out(dest, std::ios::binary | std::ios::trunc);
  FT_CHECK(out, "cannot write '" + dest.string() + "'");
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.close();
  FT_CHECK(out, "cannot write '" + dest.string() + "'");
  std::printf("Copied file to %s\n", dest.string().c_str());
  if (!torchtune_file.empty()) {
    const std::string recipe = tune_run_recipe(text, stem);
    std::printf("(torchtune's config %s, from %s)\n", stem.c_str(), torchtune_file.c_str());
    if (recipe.empty()) {
      std::printf(
          "Its header names no `tune run` recipe; pass --recipe NAME to validate and plan.\n");
    } else if (std::string missing =
                   missing_torchtune_recipe(recipe, "named in its `tune run` line");
               !missing.empty()) {
      std::printf("Note: %s.\n", missing.c_str());
    } else {
      std::printf("Run it with: fusetune run %s --config %s\n", recipe.c_str(),
                  dest.string().c_str());
    }
    // A Hub dataset needs a local copy: say so now rather than at the first run.
    try {
      const Config c = Config::from_string(text, torchtune_file);
      for (const char* section : {"dataset", "dataset_val"}) {
        const std::string key = std::string(section) + "._component_";
        if (!c.has(key) || c.has(std::string(section) + ".source")) continue;
        if (const DatasetBuilder* b = find_dataset_builder(c.str(key)); b && !b->hub_source.empty())
          std::printf(
              "Its %s reads the Hugging Face Hub dataset %s: download it and set %s.source="
              "/path/to/local/copy.json\n",
              section, b->hub_source.c_str(), section);
      }
    } catch (const Error&) {
      // The copy is what was asked for; `fusetune validate` reports what does not parse.
    }
  }
  return 0;
}

}  // namespace fusetune::cli
