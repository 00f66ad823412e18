// libFuzzer target: arbitrary bytes as a YAML recipe config. Any input must either fail to
// parse with fusetune::Error or be checked against every recipe's schema (problems listed,
// never a crash); a config with no problems must fill in its defaults and check clean again.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "fusetune/config/config.h"
#include "fusetune/config/schema.h"
#include "fusetune/recipes/registry.h"
#include "fusetune/util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fusetune;
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const Config cfg = Config::from_string(text, "fuzz.yaml");
    for (const RecipeInfo& r : recipes()) {
      const Problems p = check_config(cfg, *r.schema);
      if (!p.errors.empty()) continue;
      const Config full = with_defaults(cfg, *r.schema);
      if (!check_config(full, *r.schema).errors.empty()) std::abort();  // defaults broke it
    }
  } catch (const Error&) {
  }
  return 0;
}
