#pragma once
// The training script shared by the single-device recipes. A recipe says what it trains
// (which parameters, and any change to the model); the loop is the same: load, build the
// joint step graph, compile it as `compile` says, iterate, log, checkpoint, resume.
#include <functional>
#include <string>

#include "fusetune/config/config.h"
#include "fusetune/models/llama.h"
#include "fusetune/recipes/recipe_setup.h"
#include "fusetune/recipes/training_checkpoint.h"

namespace fusetune {

struct TrainJob {
  std::string recipe;
  TrainablePredicate trainable;
  // Optional hooks (PEFT recipes); each empty one keeps the full fine-tuning behaviour.
  LlamaOptions llama;                         // linear-layer hooks for the step graphs
  std::function<void(LoadedModel&)> prepare;  // after loading: add adapters, quantize the base
  // Extra step inputs (a dropout seed): called for every micro-batch.
  std::function<void(TensorMap& inputs, int64_t global_step, int64_t micro_step)> add_inputs;
  // Checkpoint writing and resuming; defaults: save_training_checkpoint, load_training_checkpoint.
  std::function<void(const std::filesystem::path&, const CheckpointContent&)> save;
  std::function<ResumedState(const std::filesystem::path&, DType)> load;
};

int run_training(const Config& cfg, const TrainJob& job);

}  // namespace fusetune
