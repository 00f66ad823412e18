#include "fusetune/recipes/registry.h"

#include <map>
#include <memory>

#include "fusetune/config/distributed_schemas.h"
#include "fusetune/config/inference_schemas.h"
#include "fusetune/config/recipe_schemas.h"
#include "fusetune/recipes/distillation_recipe.h"
#include "fusetune/recipes/distributed_recipes.h"
#include "fusetune/recipes/dpo_recipes.h"
#include "fusetune/recipes/evaluate.h"
#include "fusetune/recipes/full_finetune_single_device.h"
#include "fusetune/recipes/generate.h"
#include "fusetune/recipes/grpo_recipes.h"
#include "fusetune/recipes/lora_finetune_single_device.h"
#include "fusetune/recipes/ppo_recipe.h"
#include "fusetune/recipes/qat_recipes.h"
#include "fusetune/recipes/recipe_inference.h"
#include "fusetune/recipes/reward_recipes.h"
#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune {
namespace {

constexpr RecipeTraits kFull{.trains = true};
constexpr RecipeTraits kLora{.trains = true, .lora = true};
constexpr RecipeTraits kQat{.trains = true, .qat = true};
constexpr RecipeTraits kQatLora{.trains = true, .lora = true, .qat = true};
constexpr RecipeTraits kFullDpo{.trains = true, .dpo = true};
constexpr RecipeTraits kLoraDpo{.trains = true, .lora = true, .dpo = true};
constexpr RecipeTraits kReward{.trains = true, .reward = true};
constexpr RecipeTraits kLoraReward{.trains = true, .lora = true, .reward = true};
constexpr RecipeTraits kInference{};

// A GRPO recipe's schema with its `rewards` check (grpo_recipes.h), built once per schema.
const Schema* rewards_checked(const Schema& base) {
  static std::map<const Schema*, std::unique_ptr<Schema>> made;
  std::unique_ptr<Schema>& s = made[&base];
  if (!s) s = std::make_unique<Schema>(with_rewards_check(base));
  return s.get();
}

constexpr RecipeTraits on_ranks(RecipeTraits t) {
  t.distributed = true;
  return t;
}

}  // namespace

const std::vector<RecipeInfo>& recipes() {
  static const std::vector<RecipeInfo> all = {
      {"full_finetune_single_device", "Full fine-tuning on one device: every weight is trained",
       &full_finetune_schema(), full_finetune_single_device, kFull},
      {"lora_finetune_single_device",
       "LoRA / DoRA / QLoRA fine-tuning on one device: small adapters on a frozen base",
       &lora_finetune_schema(), lora_finetune_single_device, kLora},
      {"lora_dpo_single_device",
       "Preference optimization (DPO, RSO, IPO, SimPO, ORPO, KTO) of LoRA adapters on one device",
       &lora_dpo_schema(), lora_dpo_single_device, kLoraDpo},
      {"full_dpo_single_device",
       "Preference optimization (DPO, RSO, IPO, SimPO, ORPO, KTO) of every weight on one device",
       &full_dpo_schema(), full_dpo_single_device, kFullDpo},
      {"knowledge_distillation_single_device",
       "Knowledge distillation on one device: a student (LoRA or full) trained on (1 - kd_ratio) "
       "CE + kd_ratio KD against a frozen teacher's next-token distributions",
       &knowledge_distillation_schema(), knowledge_distillation_single_device, kFull},
      {"qat_single_device",
       "Quantization-aware full fine-tuning on one device: linear layers fake-quantized "
       "(torchao int4/int8 or llama.cpp Q4_0/Q8_0)",
       &qat_schema(), qat_single_device, kQat},
      {"qat_lora_finetune_single_device",
       "Quantization-aware LoRA on one device: adapters on a fake-quantized base",
       &qat_lora_schema(), qat_lora_finetune_single_device, kQatLora},
      {"full_finetune_distributed",
       "Full fine-tuning over N data-parallel ranks (MPI: --nproc_per_node N, mpirun, srun)",
       &full_finetune_distributed_schema(), full_finetune_distributed, on_ranks(kFull)},
      {"lora_finetune_distributed",
       "LoRA / DoRA / QLoRA fine-tuning over N data-parallel ranks (MPI: --nproc_per_node N, "
       "mpirun, srun)",
       &lora_finetune_distributed_schema(), lora_finetune_distributed, on_ranks(kLora)},
      {"qat_distributed",
       "Quantization-aware full fine-tuning over N data-parallel ranks (MPI: --nproc_per_node "
       "N, mpirun, srun)",
       &qat_distributed_schema(), qat_distributed, on_ranks(kQat)},
      {"qat_lora_finetune_distributed",
       "Quantization-aware LoRA over N data-parallel ranks (MPI: --nproc_per_node N, mpirun, "
       "srun)",
       &qat_lora_finetune_distributed_schema(), qat_lora_finetune_distributed, on_ranks(kQatLora)},
      {"lora_dpo_distributed",
       "Preference optimization (DPO, RSO, IPO, SimPO, ORPO, KTO) of LoRA adapters over N "
       "data-parallel "
       "ranks (MPI)",
       &lora_dpo_distributed_schema(), lora_dpo_distributed, on_ranks(kLoraDpo)},
      {"full_dpo_distributed",
       "Preference optimization (DPO, RSO, IPO, SimPO, ORPO, KTO) of every weight over N "
       "data-parallel "
       "ranks (MPI)",
       &full_dpo_distributed_schema(), full_dpo_distributed, on_ranks(kFullDpo)},
      {"knowledge_distillation_distributed",
       "Knowledge distillation over N data-parallel ranks (MPI): the student as on one device, "
       "the frozen teacher on every rank",
       &knowledge_distillation_distributed_schema(), knowledge_distillation_distributed,
       on_ranks(kFull)},
      {"grpo_full_finetune_single_device",
       "GRPO of every weight on one device: sampled completions scored by rewards, "
       "group-normalized advantages, the clipped policy loss (torchtune's and TRL's)",
       rewards_checked(grpo_full_schema()), grpo_full_finetune_single_device, kFull},
      {"lora_grpo_finetune_single_device",
       "GRPO of LoRA adapters on one device; the reference is the base without the adapters",
       rewards_checked(lora_grpo_schema()), lora_grpo_finetune_single_device, kLora},
      {"grpo_full_finetune_distributed",
       "GRPO of every weight over N data-parallel ranks (MPI): each rank generates and trains "
       "its own prompts",
       rewards_checked(grpo_full_distributed_schema()), grpo_full_finetune_distributed,
       on_ranks(kFull)},
      {"lora_grpo_finetune_distributed", "GRPO of LoRA adapters over N data-parallel ranks (MPI)",
       rewards_checked(lora_grpo_distributed_schema()), lora_grpo_finetune_distributed,
       on_ranks(kLora)},
      {"ppo_full_finetune_single_device",
       "PPO (RLHF) of every weight on one device: responses sampled on the training weights, "
       "scored by a frozen reward model, GAE advantages from a trained value model, "
       "torchtune's clipped PPOLoss",
       &ppo_schema(), ppo_full_finetune_single_device, kFull},
      {"ppo_full_finetune_distributed",
       "PPO (RLHF) of every weight over N data-parallel ranks (MPI): each rank generates and "
       "scores its own prompts; whitening, loss means and gradients span every rank",
       &ppo_full_distributed_schema(), ppo_full_finetune_distributed, on_ranks(kFull)},
      {"reward_model_finetune_single_device",
       "Reward model training on one device: a sequence classifier (score head) trained on "
       "preference pairs with TRL RewardTrainer's loss, saved as a Hugging Face "
       "*ForSequenceClassification checkpoint",
       &reward_model_schema(), reward_model_finetune_single_device, kReward},
      {"lora_reward_model_finetune_single_device",
       "Reward model training of LoRA adapters on one device: the trunk adapted, the score "
       "head trained in full (TRL RewardTrainer with a PEFT config); saves the merged "
       "classifier and a PEFT adapter holding the score head",
       &lora_reward_model_schema(), lora_reward_model_finetune_single_device, kLoraReward},
      {"reward_model_finetune_distributed",
       "Reward model training over N data-parallel ranks (MPI): the loss's mean spans every "
       "rank's pairs",
       &reward_model_distributed_schema(), reward_model_finetune_distributed, on_ranks(kReward)},
      {"generate",
       "Generate text from a model (and adapter) with a KV cache; also `fusetune generate`",
       &generate_schema(), generate_recipe, kInference},
      {"eval",
       "Perplexity or multiple-choice accuracy of a model (and adapter); also `fusetune eval`",
       &eval_schema(), eval_recipe, kInference},
  };
  return all;
}

const RecipeTraits& recipe_traits(const std::string& name) { return find_recipe(name).traits; }

const RecipeInfo& find_recipe(const std::string& name) {
  std::vector<std::string> names;
  for (const auto& r : recipes()) {
    if (r.name == name) return r;
    names.push_back(r.name);
  }
  // torchtune users may type the recipe file name.
  if (name.size() > 3 && name.compare(name.size() - 3, 3, ".py") == 0)
    return find_recipe(name.substr(0, name.size() - 3));
  // torchtune's dev/ recipes (dev/grpo_full_finetune_single_device) by their name here, when
  // fusetune has it (the others get missing_torchtune_recipe's message under their own name).
  if (name.rfind("dev/", 0) == 0)
    for (const auto& r : recipes())
      if (r.name == name.substr(4)) return r;
  // torchtune's recipes that fusetune does not have yet get their own message.
  if (std::string missing = missing_torchtune_recipe(name); !missing.empty()) throw Error(missing);
  std::string msg = "unknown recipe '" + name + "'";
  std::string near = closest_match(name, names);
  if (!near.empty()) msg += " (did you mean '" + near + "'?)";
  throw Error(msg + "; recipes: " + join(names, ", "));
}

}  // namespace fusetune
