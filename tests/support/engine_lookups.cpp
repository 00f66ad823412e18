#include "engine_lookups.h"

#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/recipes/registry.h"

namespace fusetune::testing {

TensorMap load_checkpoint_params(const std::filesystem::path& dir) {
  HFCheckpoint ck = load_hf_checkpoint(dir);
  TensorMap p;
  for (auto& [n, t] : ck.tensors) p[n] = t;
  return p;
}

bool is_registered_recipe(const std::string& name) {
  for (const auto& r : recipes())
    if (r.name == name) return true;
  return false;
}

}  // namespace fusetune::testing
