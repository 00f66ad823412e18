#pragma once
// The one writer and reader of a checkpoint's recipe state, used by every recipe (docs/design.md
// §7): recipe_state.json (where training stands) and recipe_state.safetensors (the optimizer
// state, and any tensors a recipe adds such as fp32 master weights). A checkpoint is published
// whole: its files are written into a staging `<dir>.tmp-*` directory and renamed to `<dir>` in
// one step, so a crash mid-save never leaves a `<dir>` with weights but no state (or new
// weights beside an old state).
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "fusetune/data/loader.h"
#include "fusetune/io/safetensors.h"
#include "fusetune/optim/optimizer.h"

namespace fusetune {

struct TrainingProgress {
  int64_t epoch = 0;          // the epoch in progress (0-based)
  int64_t step_in_epoch = 0;  // optimizer steps already taken in that epoch
  int64_t global_step = 0;    // optimizer steps taken in total
  DataLoader::State loader;   // the next batch the loader will hand out
  uint64_t seed = 0;
};

struct RecipeState {
  TrainingProgress progress;
  const Optimizer* optimizer = nullptr;  // its state goes under "optimizer.<name>"
  NamedTensors extra;                    // saved under their own names ("master.<param>")
  bool master_weights = false;           // `extra` holds master weights
  bool adapter = false;                  // the checkpoint is a PEFT adapter (json "adapter")
};

// Writes `write_model(staging)` (the model files) and the recipe state into a staging directory
// and publishes it as `dir` in one rename. An existing `dir` is only replaced when it is a
// checkpoint (empty, or holding config.json, adapter_config.json or recipe_state.json).
void publish_checkpoint(const std::filesystem::path& dir,
                        const std::function<void(const std::filesystem::path&)>& write_model,
                        const RecipeState& state);

// The progress in `dir`/recipe_state.json; none when the file is absent; an Error naming the
// file when it is not a fusetune recipe state (a missing key: the JSON library's exception).
std::optional<TrainingProgress> read_recipe_progress(const std::filesystem::path& dir);

}  // namespace fusetune
