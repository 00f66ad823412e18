#include "fusetune/recipes/ppo_recipe.h"

#include <cmath>
#include <memory>

#include "fusetune/config/components.h"
#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/recipes/dpo_recipes.h"
#include "fusetune/recipes/grpo_recipes.h"
#include "fusetune/recipes/ppo_step.h"
#include "fusetune/recipes/recipe_state.h"
#include "fusetune/recipes/train_settings.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

namespace fs = std::filesystem;

// What the job's hooks share: the value model's architecture (its parameters are the run's).
struct PpoModels {
  ModelConfig value;
};

// The frozen reward model, loaded by the step's maker.
struct PpoReward {
  ModelConfig config;
  TensorMap params;
};

// torchtune builder keys of `section` against the loaded architecture: a mismatch is an error.
void check_ppo_architecture(const Config& cfg, const std::string& section, const ModelConfig& m,
                            const std::string& dir) {
  if (!cfg.has(section)) return;
  const Config s = cfg.sub(section);
  const std::pair<const char*, int64_t> ints[] = {
      {"vocab_size", m.vocab_size},
      {"num_layers", m.num_hidden_layers},
      {"num_heads", m.num_attention_heads},
      {"num_kv_heads", m.num_key_value_heads > 0 ? m.num_key_value_heads : m.num_attention_heads},
      {"embed_dim", m.hidden_size},
      {"intermediate_dim", m.intermediate_size},
      {"max_seq_len", m.max_position_embeddings},
      {"num_classes", m.num_labels}};
  for (const auto& [key, have] : ints)
    FT_CHECK(!s.has(key) || s.i64(key) == have,
             "config key '" + s.full_key(key) + "' is " + std::to_string(s.i64(key)) +
                 " but the checkpoint " + dir + " has " + std::to_string(have) +
                 " (the architecture comes from its config.json)");
  if (s.has("norm_eps"))
    FT_CHECK(
        std::abs(s.f64("norm_eps") - m.rms_norm_eps) <= 1e-9 * std::abs(m.rms_norm_eps) + 1e-12,
        "config key '" + s.full_key("norm_eps") + "' is " + s.str("norm_eps") +
            " but the checkpoint " + dir + " has rms_norm_eps " + std::to_string(m.rms_norm_eps));
}

// A classifier of one score from `section` (value or reward model), in `dtype`.
HFCheckpoint load_ppo_classifier(const Config& cfg, const std::string& section, DType dtype,
                                 const ModelConfig& policy) {
  FT_CHECK(cfg.has(section), "the PPO recipes need " + section +
                                 " (checkpoint_dir, checkpoint_files): a classifier of one score");
  const Config c = cfg.sub(section);
  const std::string dir = c.str("checkpoint_dir");
  HFCheckpoint ck = load_hf_checkpoint_owned(dir, checkpoint_file_list(c), dtype);
  FT_CHECK(ck.config.num_labels == 1,
           "config key '" + c.full_key("checkpoint_dir") + "': " + dir +
               (ck.config.num_labels == 0
                    ? " is a causal LM, not a classifier (a *ForSequenceClassification with one "
                      "score, e.g. reward_model_finetune_single_device's output)"
                    : " is a classifier of " + std::to_string(ck.config.num_labels) +
                          " labels; PPO's value and reward models have one score"));
  FT_CHECK(ck.config.vocab_size == policy.vocab_size,
           "config key '" + c.full_key("checkpoint_dir") + "': " + dir + " has vocab_size " +
               std::to_string(ck.config.vocab_size) + " but the policy's is " +
               std::to_string(policy.vocab_size) + " (they read the same tokens)");
  check_ppo_architecture(cfg, "reward_and_value_model", ck.config, dir);
  return ck;
}

// The policy (checkpointer) and the value model beside it, under kPpoValuePrefix.
LoadedModel load_ppo_models(const Config& cfg, DType dtype, PpoModels& models) {
  Config policy_cfg = Config::from_string("{model: {init: checkpoint}}", "the PPO policy");
  policy_cfg.set("checkpointer", cfg.node("checkpointer"));
  LoadedModel m = load_model(policy_cfg, dtype);
  FT_CHECK(m.config.num_labels == 0, "checkpointer: " + m.checkpoint_dir.string() +
                                         " is a classifier; the PPO policy is a causal LM");
  check_ppo_architecture(cfg, "policy_model", m.config, m.checkpoint_dir.string());
  HFCheckpoint value = load_ppo_classifier(cfg, "value_checkpointer", dtype, m.config);
  models.value = value.config;
  for (auto& [name, t] : value.tensors) m.params[kPpoValuePrefix + name] = std::move(t);
  return m;
}

// The policy's files in `dir` (as every recipe's checkpoint) and the value model's in
// `dir`/value, published together.
void save_ppo_checkpoint(const fs::path& dir, const CheckpointContent& c,
                         const ModelConfig& value) {
  NamedTensors policy, value_tensors;
  for (const auto& [name, shape] : expected_parameters(*c.config))
    policy.push_back({name, c.params->at(name)});
  for (const auto& [name, shape] : expected_parameters(value))
    value_tensors.push_back({name, c.params->at(kPpoValuePrefix + name)});
  SaveOptions so;
  so.dtype = c.save_dtype;
  so.max_shard_bytes = c.max_shard_bytes;
  so.copy_files_from = c.copy_files_from;
  SaveOptions vo = so;
  vo.copy_files_from.clear();
  RecipeState state;
  state.progress = c.progress;
  state.optimizer = c.optimizer;
  // Weights the HF files rounded (an fp32 run saved as bf16): kept exactly, to resume.
  for (const auto& [prefix, list] :
       {std::pair{std::string(), &policy}, std::pair{kPpoValuePrefix, &value_tensors}})
    for (const auto& [name, t] : *list)
      if (t.dtype() != c.save_dtype) {
        state.extra.push_back({"master." + prefix + name, t});
        state.master_weights = true;
      }
  publish_checkpoint(
      dir,
      [&](const fs::path& staging) {
        save_hf_checkpoint(staging, *c.config, policy, so);
        save_hf_checkpoint(staging / "value", value, value_tensors, vo);
      },
      state);
}

ResumedState load_ppo_checkpoint(const fs::path& dir, DType dtype) {
  ResumedState s = load_training_checkpoint(dir, dtype);
  FT_CHECK(
      fs::exists(dir / "value" / "config.json"),
      "cannot resume from " + dir.string() + ": it has no value/ model (not a PPO checkpoint)");
  HFCheckpoint v = load_hf_checkpoint_owned(dir / "value", {}, dtype);
  for (auto& [name, t] : v.tensors)
    s.params.try_emplace(kPpoValuePrefix + name, std::move(t));  // a master copy wins
  return s;
}

PpoStepOptions ppo_options(const StepContext& ctx, const Tokenizer& tok) {
  const Config& cfg = ctx.cfg;
  PpoStepOptions o;
  o.policy = ctx.step;
  const Config loss = cfg.sub("loss");
  o.loss.epsilon = loss.f64("epsilon", 0.1);
  o.loss.value_clip_range = loss.f64("value_clip_range", 0.2);
  o.loss.value_coeff = loss.f64("value_coeff", 0.1);
  o.kl_coeff = cfg.f64("kl_coeff", 0.01);
  o.gamma = cfg.f64("gamma", 1.0);
  o.lmbda = cfg.f64("lmbda", 0.95);
  FT_CHECK(!cfg.boolean("whiten_rewards", false),
           "whiten_rewards: true is not supported (torchtune's recipe reads it but never "
           "whitens the rewards)");
  o.ppo_epochs = cfg.i64("ppo_epochs", 1);
  o.ppo_batch_size = cfg.i64("ppo_batch_size");
  o.gradient_accumulation_steps = cfg.i64("gradient_accumulation_steps", 1);
  o.forward_batch_size = cfg.i64("forward_batch_size");
  const int64_t batch = cfg.i64("batch_size");
  FT_CHECK(batch % o.forward_batch_size == 0, "batch_size (" + std::to_string(batch) +
                                                  ") must be exactly divisible by "
                                                  "forward_batch_size (" +
                                                  std::to_string(o.forward_batch_size) + ")");
  FT_CHECK(batch % o.ppo_batch_size == 0, "batch_size (" + std::to_string(batch) +
                                              ") must be exactly divisible by "
                                              "ppo_batch_size (" +
                                              std::to_string(o.ppo_batch_size) + ")");
  o.generation.max_new_tokens = cfg.i64("max_generated_tokens");
  o.generation.sampling.temperature = cfg.f64("temperature", 1.0);
  o.generation.sampling.top_k = cfg.opt_i64("top_k").value_or(0);
  o.generation.sampling.top_p = 1.0;
  o.generation.sampling.validate();
  o.generation.seed = config_seed(cfg);
  o.generation.use_kv_cache = cfg.boolean("enable_kv_cache", true);
  if (cfg.has("stop_token_ids") && cfg.is_list("stop_token_ids")) {
    for (double id : cfg.f64_list("stop_token_ids"))
      o.generation.stop_tokens.push_back(int32_t(id));
    bool has_eos = false;
    for (int32_t id : o.generation.stop_tokens) has_eos |= id == tok.eos_id();
    if (!has_eos)
      ctx.log("warning: the tokenizer's eos_id (" + std::to_string(tok.eos_id()) +
              ") is not in stop_token_ids: responses go on past it");
  } else {
    o.generation.stop_tokens = stop_tokens_of(tok, ctx.model.config);
  }
  o.min_response_length = cfg.opt_i64("min_response_length");
  o.penalise_no_eos = cfg.boolean("penalise_no_eos", false);
  o.reward_penalty = cfg.f64("reward_penalty", -3.0);
  o.pad_id = tok.pad_id();
  o.value_prefix = kPpoValuePrefix;
  o.apply_update = ctx.apply_update;
  o.optimizer_in_bwd = cfg.boolean("optimizer_in_bwd", false);
  o.comm = ctx.comm;
  return o;
}

// The policy's parameters alone (sharing storage), for the reference's shape check.
LoadedModel ppo_policy_only(const LoadedModel& m) {
  LoadedModel p;
  p.config = m.config;
  for (const auto& [name, t] : m.params)
    if (name.compare(0, kPpoValuePrefix.size(), kPpoValuePrefix) != 0) p.params[name] = t;
  return p;
}

}  // namespace

TrainJob ppo_job(const Config& cfg, const std::string& recipe, int world) {
  TrainJob job;
  job.recipe = recipe;
  job.trainable = [](const std::string&) { return true; };
  auto models = std::make_shared<PpoModels>();
  job.load_model = [&cfg, models](DType dtype) { return load_ppo_models(cfg, dtype, *models); };
  // torchtune's counts: num_steps prompts in all, batch_size per step (per rank: batch_size x
  // world prompts a step); the step splits its mini-batches in gradient_accumulation_steps
  // itself.
  job.adjust_settings = [&cfg, world](TrainSettings& s) {
    const int64_t per_step = cfg.i64("batch_size") * world;
    const int64_t steps = cfg.i64("num_steps") / per_step;
    const std::string ranks = world > 1 ? " x " + std::to_string(world) + " ranks" : "";
    FT_CHECK(steps >= 1, "num_steps (" + cfg.str("num_steps") + ") must be at least batch_size (" +
                             cfg.str("batch_size") + ranks +
                             "): it counts prompts, num_steps // (batch_size" + ranks + ") steps");
    s.num_steps = steps;
    s.grad_accum = 1;
  };
  job.save = [models](const fs::path& dir, const CheckpointContent& c) {
    save_ppo_checkpoint(dir, c, models->value);
  };
  job.load = [](const fs::path& dir, DType dtype) { return load_ppo_checkpoint(dir, dtype); };
  auto tok = std::make_shared<std::unique_ptr<Tokenizer>>();
  auto ref = std::make_shared<TensorMap>();
  auto reward = std::make_shared<PpoReward>();
  job.make_step = [models, tok, ref, reward, recipe](const StepContext& ctx) {
    *tok = build_tokenizer(ctx.cfg);
    PpoStepOptions o = ppo_options(ctx, **tok);
    *ref = load_reference(ctx.cfg, ppo_policy_only(ctx.model), recipe, "ref_policy_checkpointer");
    HFCheckpoint ck =
        load_ppo_classifier(ctx.cfg, "reward_checkpointer", ctx.step.dtype, ctx.model.config);
    reward->config = ck.config;
    for (auto& [name, t] : ck.tensors) reward->params[name] = std::move(t);
    o.ref_params = ref.get();
    o.value_model = &models->value;
    o.reward_model = &reward->config;
    o.reward_params = &reward->params;
    return make_ppo_step(std::move(o));
  };
  return job;
}

int ppo_full_finetune_single_device(const Config& cfg) {
  return run_training(cfg, ppo_job(cfg, "ppo_full_finetune_single_device"));
}

}  // namespace fusetune
