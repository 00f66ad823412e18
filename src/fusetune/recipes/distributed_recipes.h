#pragma once
// full_finetune_distributed, lora_finetune_distributed, qat_distributed,
// qat_lora_finetune_distributed, lora_dpo_distributed, full_dpo_distributed and
// knowledge_distillation_distributed: the
// single-device recipes' jobs run as data-parallel ranks
// (train_loop.h, TrainJob::comm). Started by mpirun/srun, or by
// `fusetune run --nproc_per_node N`; started plainly, a single process.
#include "fusetune/config/config.h"

namespace fusetune {

int full_finetune_distributed(const Config& cfg);
int lora_finetune_distributed(const Config& cfg);
int qat_distributed(const Config& cfg);
int qat_lora_finetune_distributed(const Config& cfg);
// DPO: the loss is a mean over preference pairs, so the normalizer all-reduced over the ranks
// is the global pair count (TrainingStep::loss_units).
int lora_dpo_distributed(const Config& cfg);
int full_dpo_distributed(const Config& cfg);
// GRPO: each rank generates, scores and trains its own prompts; a prompt's group lives on one
// rank (its advantages are local) and its completions are seeded by its dataset index, so
// they are the same on any number of ranks. The normalizer (micro-batches, or dapo's tokens)
// is all-reduced as DPO's is.
int grpo_full_finetune_distributed(const Config& cfg);
int lora_grpo_finetune_distributed(const Config& cfg);
// PPO: each rank makes and trains the trajectory of its own prompts (seeded by their dataset
// indices); the whitening, the losses' masked means and the step line span every rank's rows
// (ppo_step.h), and the gradients of each PPO update are summed over the ranks.
int ppo_full_finetune_distributed(const Config& cfg);
// The reward model (reward_recipes.h): its loss is a mean over pairs too.
int reward_model_finetune_distributed(const Config& cfg);
// Knowledge distillation: each rank runs the frozen teacher (whole on every rank, at every
// ZeRO stage) on its share of the batch; the loss is a mean over the global unmasked labels.
int knowledge_distillation_distributed(const Config& cfg);

}  // namespace fusetune
