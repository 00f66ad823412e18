// knowledge_distillation_single_device: the shared training loop (train_loop.h) with the KD
// step (kd_step.h); knowledge_distillation_distributed runs the same job as ranks. The student is
// LoRA adapters on a frozen base when `model` names LoRA keys (model.lora_attn_modules, as
// torchtune's KD configs do), else every weight; the teacher (teacher_model + teacher_checkpointer)
// is loaded once, frozen, in the run's dtype.
#include "fusetune/recipes/distillation_recipe.h"

#include <memory>

#include "fusetune/config/schema.h"
#include "fusetune/recipes/kd_step.h"
#include "fusetune/recipes/lora_finetune_single_device.h"
#include "fusetune/recipes/recipe_setup.h"
#include "fusetune/recipes/train_loop.h"
#include "fusetune/util/error.h"

namespace fusetune {

DistillationLoss distillation_loss_from(const Config& cfg) {
  DistillationLoss l;
  const std::string name = canonical_component(cfg, "kd_loss");
  const Config k = cfg.sub("kd_loss");
  if (name == "ForwardKLLoss")
    l.kind = KdDivergence::ForwardKL;
  else if (name == "ReverseKLLoss")
    l.kind = KdDivergence::ReverseKL;
  else if (name == "GeneralizedJSDLoss")
    l.kind = KdDivergence::GeneralizedJSD;
  else
    throw Error("kd_loss: unknown divergence '" + name + "'");
  l.beta = k.f64("beta", 0.5);
  l.temperature = k.f64("temperature", 1.0);
  return l;
}

Config teacher_config(const Config& cfg) {
  Config t = Config::from_string("{}", cfg.source() + " (teacher_model, teacher_checkpointer)");
  t.set("model", cfg.node("teacher_model"));
  if (cfg.has("teacher_checkpointer")) t.set("checkpointer", cfg.node("teacher_checkpointer"));
  if (cfg.has("seed")) t.set("seed", cfg.node("seed"));
  return t;
}

void check_same_vocabulary(const ModelConfig& student, const ModelConfig& teacher) {
  FT_CHECK(student.vocab_size == teacher.vocab_size,
           "knowledge distillation compares the two models' next-token distributions, so they "
           "must share a vocabulary: the student's vocab_size is " +
               std::to_string(student.vocab_size) + ", the teacher's (teacher_model) " +
               std::to_string(teacher.vocab_size));
}

TrainJob distillation_job(const Config& cfg, const std::string& recipe) {
  // Both architectures before any weight is read.
  const Config tcfg = teacher_config(cfg);
  check_same_vocabulary(model_architecture(cfg), model_architecture(tcfg));
  const bool lora = cfg.has("model.lora_attn_modules");
  TrainJob job;
  if (lora) {
    job = lora_training_job(cfg, recipe).job;
  } else {
    job.recipe = recipe;
    job.trainable = [](const std::string&) { return true; };
  }
  auto teacher = std::make_shared<LoadedModel>();
  job.make_step = [teacher, tcfg](const StepContext& ctx) {
    const DType dtype = ctx.model.params.begin()->second.dtype();
    *teacher = load_model(tcfg, dtype);
    if (ctx.log)
      ctx.log("teacher: " + teacher->description + " (" +
              std::to_string(teacher->config.num_hidden_layers) + " layers, hidden " +
              std::to_string(teacher->config.hidden_size) + "), frozen");
    KdStepOptions o;
    o.student = ctx.step;
    o.loss = distillation_loss_from(ctx.cfg);
    o.kd_ratio = ctx.cfg.f64("kd_ratio");
    o.teacher = &teacher->config;
    o.teacher_params = &teacher->params;
    return make_kd_step(std::move(o));
  };
  return job;
}

int knowledge_distillation_single_device(const Config& cfg) {
  return run_training(cfg, distillation_job(cfg, "knowledge_distillation_single_device"));
}

}  // namespace fusetune
