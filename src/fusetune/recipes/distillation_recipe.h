#pragma once
// knowledge_distillation_single_device (torchtune's recipe of that name): a student trained
// on (1 - kd_ratio) CE + kd_ratio KD against a frozen teacher (recipes/kd_step.h). Its job is
// also knowledge_distillation_distributed's, run as data-parallel ranks
// (distributed_recipes.h).
#include <string>

#include "fusetune/config/config.h"
#include "fusetune/losses/distillation.h"
#include "fusetune/models/model_config.h"
#include "fusetune/recipes/train_loop.h"

namespace fusetune {

int knowledge_distillation_single_device(const Config& cfg);

// The distillation job, named `recipe`: every rank loads the whole teacher and runs its
// forward on its own share of the batch.
TrainJob distillation_job(const Config& cfg, const std::string& recipe);

// The `kd_loss` component with its keys (ForwardKLLoss, ReverseKLLoss, GeneralizedJSDLoss
// and torchtune's aliases).
DistillationLoss distillation_loss_from(const Config& cfg);

// The teacher's section of the config as a model config of its own: teacher_model as
// `model`, teacher_checkpointer as `checkpointer` (load_model and model_architecture read it).
Config teacher_config(const Config& cfg);

// Throws, naming both sizes, unless the student and the teacher share a vocabulary.
void check_same_vocabulary(const ModelConfig& student, const ModelConfig& teacher);

}  // namespace fusetune
