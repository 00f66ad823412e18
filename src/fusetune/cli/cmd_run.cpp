// fusetune run RECIPE --config CONFIG [key=value | ~key ...]
#include <cstdio>

#include "fusetune/cli/args.h"
#include "fusetune/cli/command.h"
#include "fusetune/config/builtin_configs.h"
#include "fusetune/config/schema.h"
#include "fusetune/data/hub_datasets.h"
#include "fusetune/distributed/communicator.h"
#include "fusetune/distributed/launcher.h"
#include "fusetune/recipes/registry.h"
#include "fusetune/util/error.h"

namespace fusetune::cli {

const char* const kRunHelp =
    "usage: fusetune run RECIPE --config CONFIG [key=value | ~key ...]\n"
    "       fusetune run --nproc_per_node N RECIPE --config CONFIG [key=value | ~key ...]\n"
    "\n"
    "Runs RECIPE (see `fusetune ls`) with CONFIG: a YAML file, or the name of a built-in\n"
    "config such as llama3_2/1B_full_single_device.\n"
    "\n"
    "  key=value   overrides a config key; keys are dotted (optimizer.lr=1e-4) and values\n"
    "              are YAML (lora_attn_modules=[q_proj,v_proj], clip_grad_norm=null)\n"
    "  ~key        deletes a key\n"
    "  --nproc_per_node N  a *_distributed recipe as N ranks on this host (through mpirun);\n"
    "              many hosts: mpirun -np N --hostfile FILE fusetune run ..., or srun\n"
    "\n"
    "${key} references in the config resolve after the overrides. The config is validated\n"
    "against the recipe's schema before anything runs (see `fusetune validate`). Relative\n"
    "paths in a config are relative to the current directory.\n";

Config prepare_recipe_config(const std::string& recipe_name, const Args& a, const char* usage) {
  const RecipeInfo& recipe = find_recipe(recipe_name);
  FT_CHECK(a.options.count("config"),
           std::string("missing --config CONFIG (a YAML file or a built-in config; `fusetune ls` "
                       "lists them); usage: ") +
               usage);
  Config cfg = load_config(a.option("config"));
  cfg.apply_overrides(a.overrides);
  cfg.resolve();
  apply_dataset_builders(cfg);
  std::vector<std::string> warnings;
  validate(cfg, *recipe.schema, &warnings);
  print_warnings(warnings);
  return with_defaults(cfg, *recipe.schema);
}

Config prepare_inference_config(const std::string& recipe_name,
                                const std::vector<std::string>& argv, const char* usage) {
  Args a = parse_args(argv, {{"config", "adapter"}, {}, true});
  FT_CHECK(a.positional.empty(), "unexpected argument '" + a.positional[0] +
                                     "': overrides are key=value, deletions ~key");
  if (a.options.count("adapter")) a.overrides.push_back("adapter=" + a.option("adapter"));
  return prepare_recipe_config(recipe_name, a, usage);
}

namespace {

// argv without `--nproc_per_node N` / `--nproc_per_node=N`.
std::vector<std::string> without_nproc(const std::vector<std::string>& argv) {
  std::vector<std::string> out;
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == "--nproc_per_node") {
      ++i;
      continue;
    }
    if (argv[i].rfind("--nproc_per_node=", 0) == 0) continue;
    out.push_back(argv[i]);
  }
  return out;
}

}  // namespace

int cmd_run(const std::vector<std::string>& argv) {
  Args a = parse_args(argv, {{"config", "nproc_per_node"}, {}, true});
  FT_CHECK(!a.positional.empty(),
           "missing RECIPE; usage: fusetune run RECIPE --config CONFIG [key=value ...]");
  FT_CHECK(a.positional.size() == 1, "unexpected argument '" + a.positional[1] +
                                         "': overrides are key=value, deletions ~key");
  const RecipeInfo& recipe = find_recipe(a.positional[0]);
  if (const int nproc = nproc_per_node(a)) {
    check_distributed_recipe(recipe.name, "runs");
    FT_CHECK(!dist::launched_by_mpi(),
             "--nproc_per_node inside an MPI launch: this process is already one rank of "
             "mpirun/srun; drop --nproc_per_node (the launcher sets the number of ranks)");
    // Validate once here, so a bad config fails before N ranks start.
    prepare_recipe_config(recipe.name, a, "fusetune run RECIPE --config CONFIG [key=value ...]");
    std::vector<std::string> args = {"run"};
    for (const std::string& w : without_nproc(argv)) args.push_back(w);
    std::fflush(stdout);
    std::fflush(stderr);
    dist::exec_mpirun(nproc, args);
  }
  Config cfg =
      prepare_recipe_config(recipe.name, a, "fusetune run RECIPE --config CONFIG [key=value ...]");
  std::fflush(stdout);
  return recipe.run(cfg);
}

}  // namespace fusetune::cli
