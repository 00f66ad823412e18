#pragma once
// Which recipe a config is for, when the command line does not say: `fusetune validate CONFIG`
// and `fusetune plan --config CONFIG` find it, in order, from
//   1. --recipe NAME (or plan's RECIPE argument),
//   2. the config's "# recipe: NAME" comment line (fusetune's built-in configs have one),
//   3. the `tune run [options] RECIPE --config ...` (or `fusetune run RECIPE ...`) line in the
//      config's header comments, as torchtune's configs carry,
//   4. the model: a `lora_*` / `qlora_*` builder (or LoRA keys) -> lora_finetune_single_device,
//      else full_finetune_single_device.
// torchtune recipes fusetune does not have yet (*_distributed, qat_*, knowledge
// distillation, eleuther_eval, quantize, ...) are an Error naming the recipe, and the closest
// single-device recipe when there is one.
#include <string>
#include <string_view>

#include "fusetune/config/config.h"
#include "fusetune/recipes/registry.h"

namespace fusetune {

struct RecipeChoice {
  std::string name;    // as found ("lora_finetune_distributed" is possible: see below)
  std::string reason;  // "from the config's `tune run` line"
};

// The recipe of the `tune run` / `fusetune run` line in the leading comment block that
// launches this config, with the launcher's options skipped (`--nproc_per_node 2`,
// `--nnodes=1`, `--standalone`) and a ".py" suffix dropped; "" when none. The launching line is
// the one whose --config names `config_name` (a path or name; its tail is compared), else the
// last one (a header may first show a preparation step, e.g. a distillation teacher's run).
std::string tune_run_recipe(std::string_view yaml_text, const std::string& config_name = "");

// Steps 1-4 above. `yaml_text` is the config file as written (comments included);
// `config_name` the --config argument (for tune_run_recipe).
RecipeChoice infer_recipe(const std::string& explicit_recipe, std::string_view yaml_text,
                          const Config& cfg, const std::string& config_name = "");

// A torchtune recipe fusetune has no recipe for: the message (naming it, and the closest
// single-device recipe when there is one); "" when `name` is not one of those. `origin`, when
// given, says where the name came from ("from the config's `tune run` line").
std::string missing_torchtune_recipe(const std::string& name, const std::string& origin = "");

// The registered recipe of a choice; a missing torchtune recipe or an unknown name is an
// Error that says where the name came from.
const RecipeInfo& chosen_recipe(const RecipeChoice& choice);

// "recipe NAME (REASON)": the line validate and plan print.
std::string describe(const RecipeChoice& choice);

}  // namespace fusetune
