// The reward-model recipe: the shared training loop (train_loop.h) with preference pairs as
// data and the reward step (reward_step.h).
#include "fusetune/recipes/reward_recipes.h"

#include "fusetune/peft/adapter.h"
#include "fusetune/recipes/lora_finetune_single_device.h"
#include "fusetune/recipes/reward_step.h"
#include "fusetune/recipes/train_settings.h"

namespace fusetune {

namespace {

// A causal LM checkpoint becomes a classifier of one score (a fresh `score`).
void as_reward_classifier(const Config& cfg, LoadedModel& m) {
  if (m.config.num_labels == 0)
    to_sequence_classifier(m, 1, config_seed(cfg), cfg.f64("model.initializer_range", 0.02));
}

std::unique_ptr<TrainingStep> make_reward_model_step(const StepContext& ctx) {
  // transformers finds each row's last token by the pad id: the saved config names it.
  if (ctx.model.config.pad_token_id < 0) ctx.model.config.pad_token_id = ctx.loader.collate.pad_id;
  RewardStepOptions o;
  o.model = ctx.step;
  o.loss.center_rewards_coefficient = ctx.cfg.f64("center_rewards_coefficient");
  return make_reward_step(std::move(o));
}

}  // namespace

TrainJob reward_model_job(const Config& cfg, const std::string& recipe) {
  TrainJob job;
  job.recipe = recipe;
  job.trainable = [](const std::string&) { return true; };
  job.preference_data = true;
  job.prepare = [&cfg](LoadedModel& m) { as_reward_classifier(cfg, m); };
  job.make_step = make_reward_model_step;
  return job;
}

TrainJob lora_reward_model_job(const Config& cfg, const std::string& recipe) {
  TrainJob job = lora_training_job(cfg, recipe).job;
  job.preference_data = true;
  // The classifier first, so that the adapters (and the checkpoint's config) see num_labels.
  job.prepare = [&cfg, lora = job.prepare](LoadedModel& m) {
    as_reward_classifier(cfg, m);
    lora(m);
  };
  job.trainable = [](const std::string& name) {
    return peft::is_adapter_param(name) || name == peft::kScoreWeight;
  };
  job.make_step = make_reward_model_step;
  return job;
}

int lora_reward_model_finetune_single_device(const Config& cfg) {
  return run_training(cfg, lora_reward_model_job(cfg, "lora_reward_model_finetune_single_device"));
}

int reward_model_finetune_single_device(const Config& cfg) {
  return run_training(cfg, reward_model_job(cfg, "reward_model_finetune_single_device"));
}

}  // namespace fusetune
