#include "fusetune/recipes/ppo_plan.h"

#include <algorithm>

#include "fusetune/generation/kv_cache.h"
#include "fusetune/io/hf_config.h"
#include "fusetune/models/decode_graph.h"
#include "fusetune/models/grpo_graph.h"
#include "fusetune/models/ppo_graph.h"
#include "fusetune/recipes/ppo_step.h"
#include "fusetune/util/strings.h"

namespace fusetune {
namespace {

int64_t ppo_forward_bytes(const Graph& g, const PassOptions& po) {
  const ModePlan f = plan_mode(g, po, OptimizerStateSize{});
  return f.memory.activations + f.memory.workspace;
}

}  // namespace

bool is_ppo_recipe(const std::string& recipe) { return recipe.rfind("ppo_", 0) == 0; }

PpoPlan ppo_plan_from(const Config& cfg, const ModelConfig& policy, int64_t prompt_len) {
  PpoPlan g;
  g.value = load_model_config(cfg.str("value_checkpointer.checkpoint_dir"));
  g.reward = load_model_config(cfg.str("reward_checkpointer.checkpoint_dir"));
  g.prompts = cfg.i64("batch_size");
  g.forward_rows = std::min(g.prompts, cfg.i64("forward_batch_size"));
  g.prompt_len = prompt_len;
  const int64_t pad_to = PpoStepOptions{}.pad_to;
  const int64_t longest =
      std::min(prompt_len + cfg.i64("max_generated_tokens"), policy.max_position_embeddings);
  g.seq_len = (longest + pad_to - 1) / pad_to * pad_to;
  const double t = cfg.f64("temperature", 1.0);
  g.temperature = t > 0 ? t : 1.0;
  g.epsilon = cfg.f64("loss.epsilon", 0.1);
  g.value_clip_range = cfg.f64("loss.value_clip_range", 0.2);
  g.value_coeff = cfg.f64("loss.value_coeff", 0.1);
  return g;
}

LossBuilder ppo_policy_loss_builder(const PpoPlan& g) {
  GrpoLoss l;
  l.epsilon = l.epsilon_high = g.epsilon;
  l.temperature = g.temperature;
  return grpo_loss_builder(l);
}

void add_ppo_models(const PpoPlan& g, const ModelConfig& policy, const TrainingGraphOptions& o,
                    const PassOptions& po, const OptimizerStateSize& state, bool optimizer_in_bwd,
                    ModePlan& p) {
  TrainingGraphOptions vo = o;
  vo.loss = ppo_value_loss_builder(PpoLoss{g.epsilon, g.value_clip_range, g.value_coeff});
  const ModePlan v =
      plan_mode(build_training_graph(g.value, vo).graph, po, state, optimizer_in_bwd);
  const Graph reward = build_sequence_scores_graph(g.reward, g.forward_rows, g.seq_len, o.dtype);
  const int64_t reward_weights = plan_mode(reward, po, OptimizerStateSize{}).memory.parameters;
  const int64_t policy_weights = p.memory.parameters;
  // The value model trains beside the policy; the reference is a copy of the policy's weights.
  p.memory.parameters += v.memory.parameters + policy_weights + reward_weights;
  p.memory.optimizer_state += v.memory.optimizer_state;
  p.memory.gradients += v.memory.gradients;  // both accumulate until the update
  p.memory.activations = std::max(p.memory.activations, v.memory.activations);
  p.memory.workspace = std::max(p.memory.workspace, v.memory.workspace);
  // The trajectory: generation (the cache and the prefill's activations) or the largest of its
  // forwards, forward_batch_size rows at a time; no update is running then.
  const int64_t rows = g.forward_rows;
  const int64_t kv = KVCache::bytes_for(policy, rows, g.seq_len, compute_dtype(o.dtype));
  const int64_t prefill = ppo_forward_bytes(
      build_decode_graph(policy, rows, g.prompt_len, g.seq_len, o.dtype, o.llama), po);
  const int64_t forwards =
      std::max({ppo_forward_bytes(build_token_log_probs_graph(policy, rows, g.seq_len, o.dtype,
                                                              o.llama, g.temperature),
                                  po),
                ppo_forward_bytes(build_token_values_graph(g.value, rows, g.seq_len, o.dtype), po),
                ppo_forward_bytes(reward, po)});
  const int64_t rollout = std::max(kv + prefill, forwards);
  p.memory.activations =
      std::max(p.memory.activations, rollout - p.memory.gradients - p.memory.workspace);
  p.passes.push_back(
      "PPO: value model update (weights " + format_bytes(double(v.memory.parameters)) +
      ", activations " + format_bytes(double(v.memory.activations)) + "), reference weights " +
      format_bytes(double(policy_weights)) + ", reward weights " +
      format_bytes(double(reward_weights)) + "; trajectory of " + std::to_string(g.prompts) +
      " rows of up to " + std::to_string(g.seq_len) + " tokens, " + std::to_string(rows) +
      " at a time: KV cache " + format_bytes(double(kv)) + ", prefill " +
      format_bytes(double(prefill)) + ", largest forward " + format_bytes(double(forwards)));
}

}  // namespace fusetune
