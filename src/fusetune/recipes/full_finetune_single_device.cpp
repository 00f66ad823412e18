// full_finetune_single_device: every parameter trained, one device. The step is one graph
// (model + loss + backward) run by the executor `compile` selects.
#include "fusetune/recipes/full_finetune_single_device.h"

#include "fusetune/recipes/train_loop.h"

namespace fusetune {

int full_finetune_single_device(const Config& cfg) {
  TrainJob job;
  job.recipe = "full_finetune_single_device";
  job.trainable = [](const std::string&) { return true; };
  return run_training(cfg, job);
}

}  // namespace fusetune
