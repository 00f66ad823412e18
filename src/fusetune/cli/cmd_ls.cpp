// fusetune ls: the recipes and the built-in configs for each, as torchtune's `tune ls`.
#include <cstdio>
#include <string>

#include "fusetune/cli/args.h"
#include "fusetune/cli/command.h"
#include "fusetune/config/builtin_configs.h"
#include "fusetune/recipes/recipe_inference.h"
#include "fusetune/recipes/registry.h"
#include "fusetune/util/error.h"

namespace fusetune::cli {

const char* const kLsHelp =
    "usage: fusetune ls [--verbose]\n"
    "\n"
    "Lists the recipes and the built-in configs for each. Use a config name with\n"
    "`fusetune run RECIPE --config NAME`, or copy it with `fusetune cp NAME my.yaml`.\n"
    "--verbose adds each recipe's description. When $FUSETUNE_ASSETS/torchtune_configs or\n"
    "../shared/assets/torchtune_configs exists, the number of torchtune's configs there that\n"
    "`fusetune cp` copies is shown too (--verbose: each with its `tune run` recipe).\n";

int cmd_ls(const std::vector<std::string>& argv) {
  Args a = parse_args(argv, {{}, {"verbose"}, false});
  FT_CHECK(a.positional.empty(), "fusetune ls takes no arguments, got '" + a.positional[0] + "'");
  const int width = 40;
  std::printf("%-*s %s\n", width, "RECIPE", "CONFIG");
  for (const auto& r : recipes()) {
    bool first = true;
    for (const auto& c : builtin_configs()) {
      if (c.recipe != r.name) continue;
      std::printf("%-*s %s\n", width, first ? r.name.c_str() : "", c.name.c_str());
      first = false;
    }
    if (first) std::printf("%-*s %s\n", width, r.name.c_str(), "-");
    if (a.flag("verbose")) std::printf("  %s\n", r.description.c_str());
  }
  // torchtune's own configs, when an assets folder holds them (`fusetune cp` copies them).
  const std::vector<std::string> dirs = torchtune_config_dirs();
  if (dirs.empty()) return 0;
  int n = 0, missing = 0;
  for (const std::string& name : torchtune_config_names()) {
    if (find_builtin_config(name)) continue;
    ++n;
    const std::string recipe = tune_run_recipe(config_text(find_torchtune_config(name)), name);
    const bool lacks = !missing_torchtune_recipe(recipe).empty();
    missing += lacks;
    if (a.flag("verbose"))
      std::printf("  %-*s %s%s\n", width - 2, name.c_str(), recipe.c_str(),
                  lacks ? " (not in fusetune yet)" : "");
  }
  std::printf(
      "\n%d of torchtune's configs in %s (`fusetune cp NAME my.yaml`; %d for recipes "
      "fusetune does not have yet%s)\n",
      n, dirs[0].c_str(), missing, a.flag("verbose") ? "" : "; --verbose lists them");
  return 0;
}

}  // namespace fusetune::cli
