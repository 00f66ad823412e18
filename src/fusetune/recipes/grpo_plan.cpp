#include "fusetune/recipes/grpo_plan.h"

#include <algorithm>

#include "fusetune/generation/kv_cache.h"
#include "fusetune/io/hf_config.h"
#include "fusetune/models/decode_graph.h"
#include "fusetune/models/grpo_graph.h"
#include "fusetune/models/parameters.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/recipes/grpo_recipes.h"
#include "fusetune/recipes/grpo_step.h"
#include "fusetune/util/strings.h"

namespace fusetune {
namespace {

int64_t forward_bytes(const Graph& g, const PassOptions& po) {
  const ModePlan f = plan_mode(g, po, 0.0);
  return f.memory.activations + f.memory.workspace;
}

}  // namespace

bool is_grpo_recipe(const std::string& recipe) { return recipe.find("grpo_") != std::string::npos; }

GrpoPlan grpo_plan_from(const Config& cfg, const std::string& recipe, const ModelConfig& model,
                        int64_t prompt_len) {
  const GrpoLoss loss = grpo_loss_from(cfg);
  GrpoPlan g;
  g.prompts = cfg.i64("batch_size");
  g.rows = g.prompts * cfg.i64("grpo_samples", 4);
  g.prompt_len = prompt_len;
  const int64_t pad_to = GrpoStepOptions{}.pad_to;
  const int64_t longest =
      std::min(prompt_len + cfg.i64("max_generated_tokens", 64), model.max_position_embeddings);
  g.seq_len = (longest + pad_to - 1) / pad_to * pad_to;
  g.forward_rows = std::min(g.rows, cfg.opt_i64("forward_batch_size").value_or(g.rows));
  g.temperature = loss.temperature;
  g.reference = loss.needs_reference();
  g.reference_copy = g.reference && recipe.rfind("lora_", 0) != 0;
  if (cfg.has("rewards.reward_model.checkpoint_dir"))
    g.reward_model = load_model_config(cfg.str("rewards.reward_model.checkpoint_dir"));
  return g;
}

void add_rollout(const GrpoPlan& g, const ModelConfig& model, const TrainingGraphOptions& o,
                 const PassOptions& po, ModePlan& p) {
  const int64_t weights = p.memory.parameters;
  if (g.reference_copy) p.memory.parameters += weights;
  // Generation: the cache and the prefill's activations (a decode step's are smaller).
  const int64_t kv = KVCache::bytes_for(model, g.rows, g.seq_len, compute_dtype(o.dtype));
  const int64_t prefill = forward_bytes(
      build_decode_graph(model, g.rows, g.prompt_len, g.seq_len, o.dtype, o.llama), po);
  const int64_t scoring =
      forward_bytes(build_token_log_probs_graph(model, g.forward_rows, g.seq_len, o.dtype, o.llama,
                                                g.temperature),
                    po);
  // Three int32 inputs and three (four with a reference) fp32 rows of the rollout.
  const int64_t buffers = g.rows * g.seq_len * 4 * (6 + (g.reference ? 1 : 0));
  // The reward model scores every completion at once, loaded in fp32 (reward_model_scorer.h).
  int64_t reward_weights = 0, reward_scoring = 0;
  if (g.reward_model) {
    const Graph reward =
        build_sequence_scores_graph(*g.reward_model, g.rows, g.seq_len, DType::F32);
    for (const ParamInfo& w : graph_parameters(reward)) reward_weights += shape_numel(w.shape) * 4;
    reward_scoring = forward_bytes(reward, po);
    p.memory.parameters += reward_weights;
  }
  // Before the update no gradient or activation of it is held.
  const int64_t rollout = std::max({kv + prefill, scoring + buffers, reward_scoring + buffers});
  p.memory.activations =
      std::max(p.memory.activations + buffers, rollout - p.memory.gradients - p.memory.workspace);
  p.passes.push_back(
      "rollout (" + std::to_string(g.rows) + " rows of up to " + std::to_string(g.seq_len) +
      " tokens, generated on the training weights): KV cache " + format_bytes(double(kv)) +
      ", prefill " + format_bytes(double(prefill)) + ", scoring forward " +
      format_bytes(double(scoring)) + ", buffers " + format_bytes(double(buffers)) +
      (g.reference_copy ? ", reference weights " + format_bytes(double(weights)) : "") +
      (g.reward_model ? ", reward model weights " + format_bytes(double(reward_weights)) +
                            " and scoring forward " + format_bytes(double(reward_scoring))
                      : ""));
}

}  // namespace fusetune
