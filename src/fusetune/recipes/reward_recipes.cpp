// The reward-model recipe: the shared training loop (train_loop.h) with preference pairs as
// data and the reward step (reward_step.h).
#include "fusetune/recipes/reward_recipes.h"

#include "fusetune/recipes/reward_step.h"
#include "fusetune/recipes/train_settings.h"

namespace fusetune {

TrainJob reward_model_job(const Config& cfg, const std::string& recipe) {
  TrainJob job;
  job.recipe = recipe;
  job.trainable = [](const std::string&) { return true; };
  job.preference_data = true;
  job.prepare = [seed = config_seed(cfg),
                 init_std = cfg.f64("model.initializer_range", 0.02)](LoadedModel& m) {
    if (m.config.num_labels == 0) to_sequence_classifier(m, 1, seed, init_std);
  };
  job.make_step = [](const StepContext& ctx) {
    // transformers finds each row's last token by the pad id: the saved config names it.
    if (ctx.model.config.pad_token_id < 0)
      ctx.model.config.pad_token_id = ctx.loader.collate.pad_id;
    RewardStepOptions o;
    o.model = ctx.step;
    o.loss.center_rewards_coefficient = ctx.cfg.f64("center_rewards_coefficient");
    return make_reward_step(std::move(o));
  };
  return job;
}

int reward_model_finetune_single_device(const Config& cfg) {
  return run_training(cfg, reward_model_job(cfg, "reward_model_finetune_single_device"));
}

}  // namespace fusetune
