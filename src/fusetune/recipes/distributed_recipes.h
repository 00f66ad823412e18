#pragma once
// full_finetune_distributed and lora_finetune_distributed: the single-device recipes' jobs run
// as data-parallel ranks (train_loop.h, TrainJob::comm). Started by mpirun/srun, or by
// `fusetune run --nproc_per_node N`; started plainly, a single process.
#include "fusetune/config/config.h"

namespace fusetune {

int full_finetune_distributed(const Config& cfg);
int lora_finetune_distributed(const Config& cfg);

}  // namespace fusetune
