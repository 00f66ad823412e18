#pragma once
// What a training run saves and resumes from. A checkpoint directory (output_dir/epoch_N or
// step_N) is a Hugging Face model directory that any HF tool loads, plus:
//   recipe_state.safetensors  optimizer moments, and fp32 master weights when the model files
//                             were saved in a lower precision
//   recipe_state.json         where training stands (a directory without it is not resumable)
// The directory is staged as `<dir>.tmp-*` and published whole, in one rename, so a crash
// mid-save never leaves a complete-looking `<dir>` (recipe_state.h, shared by every recipe).
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "fusetune/data/loader.h"
#include "fusetune/models/model_config.h"
#include "fusetune/optim/optimizer.h"
#include "fusetune/recipes/recipe_state.h"
#include "fusetune/runtime/executor.h"

namespace fusetune {

struct CheckpointContent {
  const ModelConfig* config = nullptr;
  const TensorMap* params = nullptr;
  const Optimizer* optimizer = nullptr;
  TrainingProgress progress;
  DType save_dtype = DType::F32;
  int64_t max_shard_bytes = int64_t(5) << 30;
  std::filesystem::path copy_files_from;  // tokenizer files of the source checkpoint
};

void save_training_checkpoint(const std::filesystem::path& dir, const CheckpointContent& c);

// The resumable checkpoint under output_dir (an epoch_<n> or step_<n> directory with a
// readable recipe_state.json) with the most optimizer steps, if any. Directories whose
// recipe_state.json exists but cannot be read are skipped; `damaged` collects why.
std::optional<std::filesystem::path> latest_resumable_checkpoint(
    const std::filesystem::path& output_dir, std::vector<std::string>* damaged = nullptr);

// checkpointer.keep_last_n_checkpoints: once `just_saved` (under output_dir) is complete -- it
// has a readable recipe_state.json -- removes the resumable epoch_<n>/step_<n> directories
// beyond the `keep_last_n` with the most optimizer steps. `just_saved` and the one a resume
// would pick (latest_resumable_checkpoint) are always kept; when `just_saved` is not complete
// nothing is removed. Directories that are not resumable (no or a damaged recipe_state.json),
// staging `.tmp-*` and `.old-*` leftovers are never touched. A directory is first renamed
// aside (`<dir>.removing-*`), so a crash mid-removal never leaves a partial `<dir>`. Returns
// the removed directories. keep_last_n < 1 is an Error.
std::vector<std::filesystem::path> prune_checkpoints(const std::filesystem::path& output_dir,
                                                     const std::filesystem::path& just_saved,
                                                     int64_t keep_last_n);

struct ResumedState {
  TrainingProgress progress;
  TensorMap params;    // fp32 weights (master copies when present)
  StateMap optimizer;  // for Optimizer::load_state
};

ResumedState load_training_checkpoint(const std::filesystem::path& dir, DType dtype);

}  // namespace fusetune
