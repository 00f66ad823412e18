#pragma once
// A recipe's config as `fusetune run` prepares it (loaded, overridden, resolved, validated,
// defaults applied), for tests that plan a step without running it.
#include <string>
#include <vector>

#include "fusetune/config/builtin_configs.h"
#include "fusetune/config/schema.h"
#include "fusetune/recipes/registry.h"

namespace fusetune::testing {

// `config`: a path or a built-in config's name.
inline Config prepared_config(const std::string& recipe, const std::string& config,
                              const std::vector<std::string>& overrides) {
  Config c = load_config(config);
  c.apply_overrides(overrides);
  c.resolve();
  const Schema& schema = *find_recipe(recipe).schema;
  validate(c, schema);
  return with_defaults(c, schema);
}

}  // namespace fusetune::testing
