#pragma once
// The training script shared by the single-device recipes. A recipe says what it trains
// (which parameters, and any change to the model) and, when it is not supervised
// fine-tuning, its step (training_step.h); the loop is the same: load, build the step,
// iterate over micro-batches, accumulate gradients, clip, update, log the step's named
// metrics, checkpoint, resume.
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "fusetune/config/config.h"
#include "fusetune/data/datasets/preference.h"
#include "fusetune/distributed/communicator.h"
#include "fusetune/models/llama.h"
#include "fusetune/recipes/recipe_setup.h"
#include "fusetune/recipes/sft_step.h"
#include "fusetune/recipes/train_settings.h"
#include "fusetune/recipes/training_checkpoint.h"

namespace fusetune {

// What a recipe's step is made from, filled in by the loop.
struct StepContext {
  const Config& cfg;
  LoadedModel& model;
  ModelStepOptions step;                     // the model, its params, hooks, passes
  const PreferenceDataset* pairs = nullptr;  // preference recipes: the training pairs
  const LoaderOptions& loader;
  std::function<void(const std::string&)> log;  // a line in the run's log
  dist::Communicator* comm = nullptr;           // the ranks (TrainJob::comm); null: one process
  const Dataset* dataset = nullptr;             // the training samples (GRPO: its prompt dataset)
  const Dataset* val_dataset = nullptr;         // dataset_val's samples, when the run has them
  // For a step that updates the weights several times per loop step (TrainingStep::
  // updates_itself, PPO's mini-batches): the loop's update (clip_grad_norm, the non-finite
  // guard, the optimizer at the step's learning rate) applied to these gradients.
  std::function<void(std::vector<std::pair<std::string, Tensor>>)> apply_update = nullptr;
};

struct TrainJob {
  std::string recipe;
  TrainablePredicate trainable;
  // Optional hooks (PEFT recipes); each empty one keeps the full fine-tuning behaviour.
  LlamaOptions llama;                      // linear-layer hooks for the step graphs
  std::optional<LlamaOptions> eval_llama;  // the hooks for validation (default: llama)
  // Takes parameters as they are loaded (QLoRA: the base straight to NF4); see load_model.
  std::shared_ptr<ParamSink> sink;
  std::function<void(LoadedModel&)> prepare;  // after loading: add adapters, collect the base
  // Extra step inputs (a dropout seed): called for every micro-batch.
  std::function<void(TensorMap& inputs, int64_t global_step, int64_t micro_step)> add_inputs;
  // Checkpoint writing and resuming; defaults: save_training_checkpoint, load_training_checkpoint.
  std::function<void(const std::filesystem::path&, const CheckpointContent&)> save;
  std::function<ResumedState(const std::filesystem::path&, DType)> load;
  // The data: samples (default) or preference pairs (the DPO recipes).
  bool preference_data = false;
  // Parameters held outside LoadedModel::params (QLoRA's NF4 base), by their logical element
  // count, for the run header; called after `prepare`. Empty: none.
  std::function<int64_t()> params_stored_elsewhere;
  // ZeRO-3: makes the step graphs bind those tensors as frozen Params and returns them by
  // those names, to be sharded with the parameters (distributed/sharded_params.h); called after
  // `prepare`, before any step graph is built. Empty: nothing to shard beyond the parameters.
  std::function<std::map<std::string, Tensor*>()> shard_stored_elsewhere;
  // The parameters `save` reads (ZeRO-3 gathers only those to rank 0); empty: all of them.
  std::function<bool(const std::string&)> save_reads;
  // How the trained model is loaded; empty: load_model(cfg, dtype, sink). PPO: the policy from
  // policy_model + checkpointer and the value model beside it.
  std::function<LoadedModel(DType)> load_model;
  // Adjusts the parsed settings before the run uses them (PPO: num_steps counts prompts, and
  // gradient_accumulation_steps splits its own mini-batches, so the loop takes one batch a step).
  std::function<void(TrainSettings&)> adjust_settings;
  // The step; empty: supervised fine-tuning (make_sft_step).
  std::function<std::unique_ptr<TrainingStep>(const StepContext&)> make_step;
  // Data parallelism (the *_distributed recipes; outlives the run): the loader shards by rank,
  // the loss units, losses and gradients are summed over the ranks before clipping, and only
  // rank 0 logs and writes checkpoints. Null: one process.
  dist::Communicator* comm = nullptr;
};

int run_training(const Config& cfg, const TrainJob& job);

}  // namespace fusetune
