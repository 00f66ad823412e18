#include "fusetune/config/distributed_schemas.h"

#include <string>

#include "fusetune/config/recipe_schemas.h"
#include "fusetune/config/scalars.h"

namespace fusetune {
namespace {

// True when `key` is a boolean set to true (a non-boolean is reported by the field's check).
bool set_true(const Config& root, const char* key) {
  if (!root.has(key) || root.is_map(key) || root.is_list(key)) return false;
  const YAML::Node n = root.node(key);
  return n.IsScalar() && parse_bool(n.Scalar()).value_or(false);
}

// preference: a DPO recipe (its step sums the gradients after the backward).
Schema distributed(Schema s, const char* recipe, bool preference = false) {
  s.recipe = recipe;
  s.add(Field::Int("zero_stage")
            .def("0")
            .min(0)
            .max(3)
            .doc("ZeRO sharding stage; 0 = every rank holds the whole model, gradients and "
                 "optimizer state (plain data parallelism); 1 = the optimizer state is sharded "
                 "(each rank updates its share of the parameters and broadcasts them); 2 = the "
                 "summed gradients are sharded too (fp32; each reduced into its owner as the "
                 "backward produces it); 3 = the parameters too: each lives on "
                 "one rank and is broadcast right before its use in the forward and again in "
                 "the backward, freed after (fp32; an NF4 base is sharded in its packed form)"));
  s.add(Field::Float("dist_timeout_seconds")
            .def("300")
            .min(0)
            .doc("how long a rank waits for the others in one collective (including rank 0 "
                 "writing a checkpoint) before it reports that a rank died or hangs and exits"));
  s.add(Field::Bool("overlap_grad_allreduce")
            .def("false")
            .doc("at zero_stage 0-1: sum the gradients over the ranks in buckets while the "
                 "backward still runs (a communication thread; MPI then runs with "
                 "MPI_THREAD_MULTIPLE), from the second step on; false sums them all after the "
                 "backward. The sums are the same. Not with the DPO recipes or zero_stage 2-3 "
                 "(a note when set there)"));
  s.add(Field::Float("bucket_cap_mb")
            .def("16")
            .min(0.001)
            .doc("at zero_stage 0-1: the size of the buckets (MiB of fp32) the gradients are "
                 "summed in over the ranks, as PyTorch DDP's bucket_cap_mb; smaller gradients "
                 "share a bucket, a larger one is summed in place (bf16: through a bucket, a "
                 "bucket at a time). Larger buckets mean fewer, larger collectives; the sums "
                 "are the same"));
  // torchtune's FSDP keys.
  s.add(Field::Bool("fsdp_cpu_offload")
            .doc("torchtune: keep parameters and optimizer state in host memory; on a CPU they "
                 "are there already (accepted, a note when true)"));
  s.add(Field::Bool("fsdp_reshard_after_forward")
            .def("true")
            .doc("torchtune: free gathered parameters after the forward (default true); false "
                 "keeps each one from its first use in the forward to its last in the backward "
                 "(one gather per step instead of two, more memory); only meaningful at "
                 "zero_stage 3 (a note otherwise)"));
  s.add(Field::List("custom_sharded_layers")
            .items(kString)
            .doc("torchtune: extra modules FSDP wraps; at zero_stage 3 every parameter is "
                 "gathered on its own already (a note); an error at other stages"));
  s.checks.push_back([preference](const Config& root, const Config&, Problems& p) {
    std::string stage = "0";
    if (root.has("zero_stage") && !root.is_map("zero_stage") && !root.is_list("zero_stage") &&
        root.node("zero_stage").IsScalar())
      stage = root.node("zero_stage").Scalar();
    const bool zero3 = stage == "3";
    if ((stage == "2" || zero3) && root.has("dtype") && root.node("dtype").IsScalar() &&
        root.node("dtype").Scalar() == "bf16")
      p.errors.push_back("zero_stage " + stage +
                         " sums fp32 gradients only, and dtype is bf16: use zero_stage 0 or 1, "
                         "or dtype: fp32 (" +
                         root.where("zero_stage") + ")");
    if (set_true(root, "overlap_grad_allreduce") && (stage == "2" || zero3))
      p.warnings.push_back(
          "overlap_grad_allreduce: true changes nothing at zero_stage 2-3: each gradient is "
          "reduced into its owner as the backward hands it over, the backward waiting for it");
    if (set_true(root, "overlap_grad_allreduce") && preference)
      p.warnings.push_back(
          "overlap_grad_allreduce: true changes nothing in the DPO recipes: their step sums the "
          "gradients after the backward");
    if (set_true(root, "fsdp_cpu_offload"))
      p.warnings.push_back(
          "fsdp_cpu_offload: true changes nothing: parameters, gradients and optimizer state "
          "already live in host memory on a CPU");
    if (root.has("fsdp_reshard_after_forward") && !zero3)
      p.warnings.push_back(
          "fsdp_reshard_after_forward changes nothing at zero_stage 0-2: no rank gathers "
          "sharded parameters (zero_stage: 3 does)");
    if (root.is_list("custom_sharded_layers") && root.node("custom_sharded_layers").size() > 0) {
      if (zero3)
        p.warnings.push_back(
            "custom_sharded_layers changes nothing: at zero_stage 3 every parameter is gathered "
            "on its own already");
      else
        p.errors.push_back(
            "custom_sharded_layers names modules to shard, which only exists with sharded "
            "parameters (zero_stage: 3); remove the key (" +
            root.where("custom_sharded_layers") + ")");
    }
  });
  return s;
}

}  // namespace

const Schema& full_finetune_distributed_schema() {
  static const Schema s = distributed(full_finetune_schema(), "full_finetune_distributed");
  return s;
}

const Schema& lora_dpo_distributed_schema() {
  static const Schema s = distributed(lora_dpo_schema(), "lora_dpo_distributed", true);
  return s;
}

const Schema& full_dpo_distributed_schema() {
  static const Schema s = distributed(full_dpo_schema(), "full_dpo_distributed", true);
  return s;
}

namespace {

// GRPO: the rollout generates on whole parameters, which ZeRO-3 does not hold.
Schema grpo_distributed(const Schema& single, const char* recipe) {
  Schema s = distributed(single, recipe);
  s.checks.push_back([](const Config& root, const Config&, Problems& p) {
    if (root.has("zero_stage") && root.node("zero_stage").IsScalar() &&
        root.node("zero_stage").Scalar() == "3")
      p.errors.push_back(
          "zero_stage 3 shards the parameters, and the GRPO recipes generate their rollouts on "
          "whole parameters: use zero_stage 0, 1 or 2 (" +
          root.where("zero_stage") + ")");
  });
  return s;
}

}  // namespace

const Schema& grpo_full_distributed_schema() {
  static const Schema s = grpo_distributed(grpo_full_schema(), "grpo_full_finetune_distributed");
  return s;
}

const Schema& lora_grpo_distributed_schema() {
  static const Schema s = grpo_distributed(lora_grpo_schema(), "lora_grpo_finetune_distributed");
  return s;
}

namespace {

Schema ppo_distributed() {
  Schema s = distributed(ppo_schema(), "ppo_full_finetune_distributed");
  s.checks.push_back([](const Config& root, const Config&, Problems& p) {
    if (root.has("zero_stage") && root.node("zero_stage").IsScalar() &&
        root.node("zero_stage").Scalar() == "3")
      p.errors.push_back(
          "zero_stage 3 shards the parameters, and PPO generates its responses on whole "
          "parameters: use zero_stage 0, 1 or 2 (" +
          root.where("zero_stage") + ")");
    if (set_true(root, "optimizer_in_bwd"))
      p.errors.push_back(
          "optimizer_in_bwd: true would update each parameter with this rank's gradient alone; "
          "ppo_full_finetune_distributed sums each PPO update's gradients over the ranks first: "
          "set optimizer_in_bwd: false (" +
          root.where("optimizer_in_bwd") + ")");
  });
  return s;
}

}  // namespace

const Schema& ppo_full_distributed_schema() {
  static const Schema s = ppo_distributed();
  return s;
}

const Schema& reward_model_distributed_schema() {
  static const Schema s =
      distributed(reward_model_schema(), "reward_model_finetune_distributed", true);
  return s;
}

const Schema& lora_finetune_distributed_schema() {
  static const Schema s = distributed(lora_finetune_schema(), "lora_finetune_distributed");
  return s;
}

const Schema& qat_distributed_schema() {
  static const Schema s = distributed(qat_schema(), "qat_distributed");
  return s;
}

const Schema& qat_lora_finetune_distributed_schema() {
  static const Schema s = distributed(qat_lora_schema(), "qat_lora_finetune_distributed");
  return s;
}

const Schema& knowledge_distillation_distributed_schema() {
  static const Schema s =
      distributed(knowledge_distillation_schema(), "knowledge_distillation_distributed");
  return s;
}

}  // namespace fusetune
