// fusetune ls: the recipes and the built-in configs for each, as torchtune's `tune ls`.
#include <cstdio>
#include <string>

#include "fusetune/cli/args.h"
#include "fusetune/cli/command.h"
#include "fusetune/config/builtin_configs.h"
#include "fusetune/recipes/registry.h"
#include "fusetune/util/error.h"

namespace fusetune::cli {

const char* const kLsHelp =
    "usage: fusetune ls [--verbose]\n"
    "\n"
    "Lists the recipes and the built-in configs for each. Use a config name with\n"
    "`fusetune run RECIPE --config NAME`, or copy it with `fusetune cp NAME my.yaml`.\n"
    "--verbose adds each recipe's description.\n";

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
  return 0;
}

}  // namespace fusetune::cli
