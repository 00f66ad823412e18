// fusetune validate CONFIG [--recipe RECIPE] [key=value ...]
#include <cstdio>

#include "fusetune/cli/args.h"
#include "fusetune/cli/command.h"
#include "fusetune/config/builtin_configs.h"
#include "fusetune/config/schema.h"
#include "fusetune/data/hub_datasets.h"
#include "fusetune/recipes/recipe_inference.h"
#include "fusetune/recipes/registry.h"
#include "fusetune/util/error.h"

namespace fusetune::cli {

const char* const kValidateHelp =
    "usage: fusetune validate CONFIG [--recipe RECIPE] [key=value | ~key ...]\n"
    "\n"
    "Checks CONFIG (a YAML file or a built-in config name), after the overrides, against a\n"
    "recipe's schema and prints \"Config is well-formed!\" or every problem found: unknown\n"
    "keys (with the closest valid one), wrong types, missing keys, invalid values.\n"
    "The recipe is --recipe, else the config's \"# recipe: NAME\" comment, else the recipe of\n"
    "the `tune run RECIPE --config ...` line in its header comments (torchtune's configs),\n"
    "else lora_finetune_single_device for a lora_*/qlora_* model builder and otherwise\n"
    "full_finetune_single_device; the first line says which and why. Files named in the\n"
    "config are not opened.\n";

int cmd_validate(const std::vector<std::string>& argv) {
  Args a = parse_args(argv, {{"recipe"}, {}, true});
  FT_CHECK(!a.positional.empty(),
           "missing CONFIG; usage: fusetune validate CONFIG [--recipe RECIPE] [key=value ...]");
  FT_CHECK(a.positional.size() == 1, "unexpected argument '" + a.positional[1] +
                                         "': overrides are key=value, deletions ~key");
  const std::string& config_arg = a.positional[0];
  Config cfg = load_config(config_arg);
  cfg.apply_overrides(a.overrides);
  const RecipeChoice choice =
      infer_recipe(a.option("recipe"), config_text(config_arg), cfg, config_arg);
  const RecipeInfo& info = chosen_recipe(choice);
  std::printf("%s\n", describe(choice).c_str());
  std::fflush(stdout);
  apply_dataset_builders(cfg);
  std::vector<std::string> warnings;
  validate(cfg, *info.schema, &warnings);
  print_warnings(warnings);
  std::printf("Config is well-formed!\n");
  return 0;
}

}  // namespace fusetune::cli
