#include "fusetune/recipes/distributed_recipes.h"

#include <cstdio>
#include <exception>
#include <functional>

#include "fusetune/distributed/communicator.h"
#include "fusetune/recipes/distillation_recipe.h"
#include "fusetune/recipes/dpo_recipes.h"
#include "fusetune/recipes/grpo_recipes.h"
#include "fusetune/recipes/lora_finetune_single_device.h"
#include "fusetune/recipes/ppo_recipe.h"
#include "fusetune/recipes/qat_recipes.h"
#include "fusetune/recipes/reward_recipes.h"
#include "fusetune/recipes/train_loop.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

// `make_job` is given the number of ranks (PPO's num_steps counts the prompts of all of them).
int run_ranks(const Config& cfg, const std::function<TrainJob(int world)>& make_job) {
  // A second thread calls MPI only for overlap_grad_allreduce: only then MPI_THREAD_MULTIPLE.
  auto comm = dist::Communicator::from_environment(cfg.f64("dist_timeout_seconds", 300),
                                                   cfg.boolean("overlap_grad_allreduce", false));
  TrainJob job = make_job(comm->size());
  job.comm = comm.get();
  try {
    return run_training(cfg, job);
  } catch (const std::exception& e) {
    if (comm->size() == 1) throw;
    // The other ranks would wait for this one until the timeout: end them all now.
    std::fprintf(stderr, "fusetune: error: %s: %s\n", comm->who().c_str(), e.what());
    std::fflush(stderr);
    std::fflush(stdout);
    comm->abort(1);
  }
}

int run_ranks(const Config& cfg, TrainJob job) {
  return run_ranks(cfg, [&job](int) { return std::move(job); });
}

}  // namespace

int full_finetune_distributed(const Config& cfg) {
  TrainJob job;
  job.recipe = "full_finetune_distributed";
  job.trainable = [](const std::string&) { return true; };
  return run_ranks(cfg, std::move(job));
}

int lora_finetune_distributed(const Config& cfg) {
  return run_ranks(cfg, lora_training_job(cfg, "lora_finetune_distributed").job);
}

// The QAT jobs as ranks: fake_quant_after_n_steps compares the global step, which every rank
// counts the same, so all switch fake quantization on at the same optimizer step.
int qat_distributed(const Config& cfg) {
  return run_ranks(cfg, qat_training_job(cfg, "qat_distributed"));
}

int qat_lora_finetune_distributed(const Config& cfg) {
  return run_ranks(cfg, qat_lora_training_job(cfg, "qat_lora_finetune_distributed"));
}

int lora_dpo_distributed(const Config& cfg) {
  return run_ranks(cfg, lora_dpo_job(cfg, "lora_dpo_distributed"));
}

int full_dpo_distributed(const Config& cfg) {
  return run_ranks(cfg, full_dpo_job("full_dpo_distributed"));
}

int grpo_full_finetune_distributed(const Config& cfg) {
  return run_ranks(cfg, full_grpo_job("grpo_full_finetune_distributed"));
}

int lora_grpo_finetune_distributed(const Config& cfg) {
  return run_ranks(cfg, lora_grpo_job(cfg, "lora_grpo_finetune_distributed"));
}

int ppo_full_finetune_distributed(const Config& cfg) {
  return run_ranks(
      cfg, [&cfg](int world) { return ppo_job(cfg, "ppo_full_finetune_distributed", world); });
}

int reward_model_finetune_distributed(const Config& cfg) {
  return run_ranks(cfg, reward_model_job(cfg, "reward_model_finetune_distributed"));
}

int knowledge_distillation_distributed(const Config& cfg) {
  return run_ranks(cfg, distillation_job(cfg, "knowledge_distillation_distributed"));
}

}  // namespace fusetune
