// fusetune validate CONFIG [--recipe RECIPE] [key=value ...]
#include <cstdio>
#include <fstream>
#include <iterator>

#include "fusetune/cli/args.h"
#include "fusetune/cli/command.h"
#include "fusetune/config/builtin_configs.h"
#include "fusetune/config/schema.h"
#include "fusetune/recipes/registry.h"
#include "fusetune/util/error.h"

namespace fusetune::cli {

const char* const kValidateHelp =
    "usage: fusetune validate CONFIG [--recipe RECIPE] [key=value | ~key ...]\n"
    "\n"
    "Checks CONFIG (a YAML file or a built-in config name), after the overrides, against a\n"
    "recipe's schema and prints \"Config is well-formed!\" or every problem found: unknown\n"
    "keys (with the closest valid one), wrong types, missing keys, invalid values.\n"
    "The recipe is --recipe, else the config's \"# recipe: NAME\" comment, else\n"
    "full_finetune_single_device. Files named in the config are not opened.\n";

int cmd_validate(const std::vector<std::string>& argv) {
  Args a = parse_args(argv, {{"recipe"}, {}, true});
  FT_CHECK(!a.positional.empty(),
           "missing CONFIG; usage: fusetune validate CONFIG [--recipe RECIPE] [key=value ...]");
  FT_CHECK(a.positional.size() == 1, "unexpected argument '" + a.positional[1] +
                                         "': overrides are key=value, deletions ~key");
  const std::string& config_arg = a.positional[0];
  Config cfg = load_config(config_arg);
  std::string recipe = a.option("recipe");
  if (recipe.empty()) {
    if (const BuiltinConfig* b = find_builtin_config(config_arg)) {
      recipe = b->recipe;
    } else {
      std::ifstream in(config_arg);
      std::string head((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      recipe = recipe_comment(head);
    }
  }
  if (recipe.empty()) recipe = "full_finetune_single_device";
  const RecipeInfo& info = find_recipe(recipe);
  cfg.apply_overrides(a.overrides);
  std::vector<std::string> warnings;
  validate(cfg, *info.schema, &warnings);
  print_warnings(warnings);
  std::printf("Config is well-formed!\n");
  return 0;
}

}  // namespace fusetune::cli
