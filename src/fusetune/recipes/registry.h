#pragma once
// The recipes `fusetune run` can start, each with the schema its config is validated against.
// A recipe's run function receives the config resolved, validated and with the schema's
// defaults filled in (with_defaults), `_component_` names canonical; it returns the exit code.
#include <functional>
#include <string>
#include <vector>

#include "fusetune/config/config.h"
#include "fusetune/config/schema.h"

namespace fusetune {

// What a recipe is, for code that plans or runs it (docs/design.md §7): read from its registry
// entry, never from its name.
struct RecipeTraits {
  bool trains = false;       // a training recipe (the others generate or evaluate)
  bool lora = false;         // adapters train on a frozen base (peft/lora.h)
  bool qat = false;          // the linear layers are fake-quantized (quant/qat.h)
  bool dpo = false;          // a preference objective on pairs (dpo_step.h)
  bool distributed = false;  // data-parallel ranks (MPI)
  bool reward = false;       // a sequence classifier trained on pairs (reward_step.h)
};

struct RecipeInfo {
  std::string name;
  std::string description;
  const Schema* schema;
  std::function<int(const Config&)> run;
  RecipeTraits traits;
};

const std::vector<RecipeInfo>& recipes();
// The recipe of this name; unknown -> an Error with the closest name.
const RecipeInfo& find_recipe(const std::string& name);
// find_recipe(name).traits.
const RecipeTraits& recipe_traits(const std::string& name);

}  // namespace fusetune
