#pragma once
// Small look-ups into the engine that several test files make: a Hugging Face checkpoint
// directory's tensors as the executors' parameter map, and whether a recipe name is registered.
#include <filesystem>
#include <string>

#include "fusetune/runtime/executor.h"

namespace fusetune::testing {

TensorMap load_checkpoint_params(const std::filesystem::path& dir);

bool is_registered_recipe(const std::string& name);

}  // namespace fusetune::testing
