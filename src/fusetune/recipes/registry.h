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

struct RecipeInfo {
  std::string name;
  std::string description;
  const Schema* schema;
  std::function<int(const Config&)> run;
};

const std::vector<RecipeInfo>& recipes();
// The recipe of this name; unknown -> an Error with the closest name.
const RecipeInfo& find_recipe(const std::string& name);

}  // namespace fusetune
