#include "fusetune/recipes/grpo_recipes.h"

#include <algorithm>
#include <memory>

#include "fusetune/config/schema.h"
#include "fusetune/data/datasets/prompts.h"
#include "fusetune/recipes/dpo_recipes.h"
#include "fusetune/recipes/grpo_step.h"
#include "fusetune/recipes/lora_finetune_single_device.h"
#include "fusetune/recipes/recipe_setup.h"
#include "fusetune/recipes/reward_model_scorer.h"
#include "fusetune/recipes/train_settings.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

// Without a `rewards` map: the GSM8K rewards the default prompt asks for (tagged reasoning,
// the answer after "####").
// A `reward_model` reward's classifier is scored in the policy's compile mode.
std::shared_ptr<const RewardSet> rewards_from(const Config& cfg, const Tokenizer& tok,
                                              CompileMode mode) {
  if (cfg.has("rewards"))
    return std::make_shared<RewardSet>(RewardSet::from_config(
        cfg.sub("rewards"),
        [&tok, mode](const Config& section) { return reward_model_scorer(section, tok, mode); }));
  const Config def = Config::from_string("{format: {}, answer_match: {}}", "the default rewards");
  return std::make_shared<RewardSet>(RewardSet::from_config(def));
}

GrpoStepOptions grpo_options(const StepContext& ctx, const Tokenizer& tok) {
  const Config& cfg = ctx.cfg;
  GrpoStepOptions o;
  o.policy = ctx.step;
  o.loss = grpo_loss_from(cfg);
  o.scale_rewards = cfg.boolean("scale_rewards", true);
  o.samples = cfg.i64("grpo_samples", 4);
  FT_CHECK(!(cfg.has("num_iterations") && cfg.has("ppo_epochs")),
           "config keys 'num_iterations' and 'ppo_epochs' name the same thing (optimizer steps "
           "per rollout): give one");
  o.num_iterations = cfg.has("ppo_epochs") ? cfg.i64("ppo_epochs") : cfg.i64("num_iterations", 1);
  o.forward_batch_size = cfg.opt_i64("forward_batch_size").value_or(0);
  o.generation.max_new_tokens = cfg.i64("max_generated_tokens", 64);
  o.generation.sampling.temperature = cfg.f64("temperature", 1.0);
  o.generation.sampling.top_k = cfg.opt_i64("top_k").value_or(0);
  o.generation.sampling.top_p = 1.0;
  o.generation.sampling.validate();
  o.generation.seed = config_seed(cfg);
  o.generation.stop_tokens = stop_tokens_of(tok, ctx.model.config);
  o.prompts = dynamic_cast<const datasets::PromptDataset*>(ctx.dataset);
  FT_CHECK(o.prompts,
           "the GRPO recipes generate from prompts: set dataset._component_: gsm8k "
           "(torchtune.dev.grpo.gsm8k.gsm8k_dataset)");
  o.tokenizer = &tok;
  o.rewards = rewards_from(cfg, tok, ctx.step.passes.mode);
  return o;
}

}  // namespace

std::vector<int32_t> stop_tokens_of(const Tokenizer& tok, const ModelConfig& model) {
  std::vector<int32_t> ids;
  if (tok.eos_id() >= 0) ids.push_back(tok.eos_id());
  for (int64_t id : model.eos_token_ids) ids.push_back(int32_t(id));
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

Schema with_rewards_check(const Schema& schema) {
  Schema s = schema;
  s.checks.push_back([](const Config& root, const Config&, Problems& p) {
    if (!root.has("rewards") || !root.is_map("rewards")) return;  // the field's own check
    try {
      RewardSet::from_config(root.sub("rewards"), [](const Config&) { return CompletionScorer(); });
    } catch (const Error& e) {
      p.errors.push_back(e.what());
    }
  });
  return s;
}

GrpoLoss grpo_loss_from(const Config& cfg) {
  // No `loss` section: torchtune's GRPOSimpleLoss with its defaults (the GRPO schemas' default).
  const bool given = cfg.has("loss");
  const std::string kind = given ? canonical_component(cfg, "loss") : "GRPOSimpleLoss";
  const Config c = given ? cfg.sub("loss") : Config::from_string("{}\n", "GRPOSimpleLoss");
  GrpoLoss l;
  if (kind == "GRPOSimpleLoss") {
    l.beta = c.f64("kl_coeff", 0.1);
    l.epsilon = l.epsilon_high = c.f64("epsilon", 0.1);
  } else if (kind == "GRPOLoss") {
    l.type = grpo_loss_type_from(c.str("loss_type", "grpo"), c.full_key("loss_type"));
    l.beta = c.f64("beta", 0.0);
    l.epsilon = c.f64("epsilon", 0.2);
    l.epsilon_high = c.f64("epsilon_high", l.epsilon);
  } else {
    throw Error("config key 'loss._component_' is " + kind +
                ": the GRPO recipes train with GRPOSimpleLoss or GRPOLoss");
  }
  FT_CHECK(l.epsilon >= 0 && l.epsilon < 1 && l.epsilon_high >= 0,
           "config key 'loss.epsilon' must be in [0, 1) and epsilon_high >= 0");
  const double t = cfg.f64("temperature", 1.0);
  l.temperature = t > 0 ? t : 1.0;  // greedy rollouts are scored at temperature 1
  return l;
}

TrainJob full_grpo_job(const std::string& recipe) {
  TrainJob job;
  job.recipe = recipe;
  job.trainable = [](const std::string&) { return true; };
  auto ref = std::make_shared<TensorMap>();
  auto tok = std::make_shared<std::unique_ptr<Tokenizer>>();
  job.make_step = [ref, tok, recipe](const StepContext& ctx) {
    *tok = build_tokenizer(ctx.cfg);
    GrpoStepOptions o = grpo_options(ctx, **tok);
    // beta = 0: no reference is loaded.
    if (o.loss.needs_reference()) *ref = load_reference(ctx.cfg, ctx.model, recipe);
    o.ref_params = ref.get();
    return make_grpo_step(std::move(o));
  };
  return job;
}

TrainJob lora_grpo_job(const Config& cfg, const std::string& recipe) {
  LoraJob lora = lora_training_job(cfg, recipe);
  TrainJob job = std::move(lora.job);
  auto tok = std::make_shared<std::unique_ptr<Tokenizer>>();
  job.make_step = [base = lora.base, tok](const StepContext& ctx) {
    *tok = build_tokenizer(ctx.cfg);
    GrpoStepOptions o = grpo_options(ctx, **tok);
    o.ref_params = &ctx.model.params;  // the graph reads the base weights only
    o.ref_llama = base;
    return make_grpo_step(std::move(o));
  };
  return job;
}

int grpo_full_finetune_single_device(const Config& cfg) {
  return run_training(cfg, full_grpo_job("grpo_full_finetune_single_device"));
}

int lora_grpo_finetune_single_device(const Config& cfg) {
  return run_training(cfg, lora_grpo_job(cfg, "lora_grpo_finetune_single_device"));
}

}  // namespace fusetune
