// The DPO recipes. All are the shared training loop (train_loop.h) with preference pairs as
// data and the DPO step (dpo_step.h); LoRA and full DPO differ in what trains and where the
// reference model comes from. The *_distributed ones run the same jobs as data-parallel ranks
// (distributed_recipes.cpp).
#include "fusetune/recipes/dpo_recipes.h"

#include "fusetune/config/components.h"
#include "fusetune/config/schema.h"
#include "fusetune/distributed/sharded_params.h"
#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/recipes/dpo_step.h"
#include "fusetune/recipes/lora_finetune_single_device.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

DpoStepOptions dpo_options(const StepContext& ctx) {
  DpoStepOptions o;
  o.policy = ctx.step;
  o.loss = preference_loss_from(ctx.cfg);
  o.precompute_ref = ctx.cfg.boolean("precompute_ref_log_probs", false);
  o.pairs = ctx.pairs;
  o.loader = ctx.loader;
  o.log = ctx.log;
  o.comm = ctx.comm;
  return o;
}

}  // namespace

TensorMap load_reference(const Config& cfg, const LoadedModel& policy, const std::string& recipe,
                         const std::string& section) {
  FT_CHECK(cfg.has(section),
           recipe + ": " + canonical_component(cfg, "loss") +
               " compares the policy with a reference model: set " + section +
               " "
               "(checkpoint_dir, checkpoint_files), usually the checkpointer's starting weights");
  const Config rc = cfg.sub(section);
  const std::string dir = rc.str("checkpoint_dir");
  // Owned and counted (the mapped file may be rewritten), converted straight from the file
  // into the policy's dtype.
  HFCheckpoint ck = load_hf_checkpoint_owned(dir, checkpoint_file_list(rc),
                                             policy.params.begin()->second.dtype());
  TensorMap ref;
  for (const auto& [name, t] : policy.params) {
    auto it = ck.tensors.find(name);
    FT_CHECK(it != ck.tensors.end(), section + ": " + dir + " has no tensor '" + name +
                                         "' (the reference model "
                                         "must have the policy's architecture)");
    FT_CHECK(it->second.shape() == t.shape(), section + ": tensor '" + name + "' in " + dir +
                                                  " is " + shape_str(it->second.shape()) +
                                                  " but the policy's is " + shape_str(t.shape()));
    ref[name] = it->second;
  }
  return ref;
}

TrainJob lora_dpo_job(const Config& cfg, const std::string& recipe) {
  LoraJob lora = lora_training_job(cfg, recipe);
  TrainJob job = std::move(lora.job);
  job.preference_data = true;
  job.make_step = [base = lora.base](const StepContext& ctx) {
    DpoStepOptions o = dpo_options(ctx);
    o.ref_params = &ctx.model.params;  // the graph reads the base weights only
    o.ref_llama = base;
    return make_dpo_step(std::move(o));
  };
  return job;
}

TrainJob full_dpo_job(const std::string& recipe) {
  TrainJob job;
  job.recipe = recipe;
  job.trainable = [](const std::string&) { return true; };
  job.preference_data = true;
  auto ref = std::make_shared<TensorMap>();
  auto ref_shards = std::make_shared<std::unique_ptr<dist::ShardedParams>>();
  job.make_step = [ref, ref_shards, recipe](const StepContext& ctx) {
    DpoStepOptions o = dpo_options(ctx);
    if (o.loss.needs_reference()) *ref = load_reference(ctx.cfg, ctx.model, recipe);
    o.ref_params = ref.get();
    // ZeRO-3 (the policy's parameters come from a sharded source): the reference copy is
    // sharded by the same partition, each rank keeping the tensors of the parameters it owns.
    if (o.loss.needs_reference() && ctx.step.param_source && ctx.comm && ctx.comm->size() > 1) {
      *ref_shards =
          std::make_unique<dist::ShardedParams>(*ctx.comm, *ref, std::vector<std::string>{});
      (*ref_shards)->release_others();
      o.ref_source = (*ref_shards)->source();
    }
    return make_dpo_step(std::move(o));
  };
  return job;
}

int lora_dpo_single_device(const Config& cfg) {
  return run_training(cfg, lora_dpo_job(cfg, "lora_dpo_single_device"));
}

int full_dpo_single_device(const Config& cfg) {
  return run_training(cfg, full_dpo_job("full_dpo_single_device"));
}

}  // namespace fusetune
