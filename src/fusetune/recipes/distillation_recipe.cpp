// knowledge_distillation_single_device: the shared training loop (train_loop.h) with the KD
// step (kd_step.h); knowledge_distillation_distributed runs the same job as ranks. The student is
// LoRA adapters on a frozen base when `model` names LoRA keys (model.lora_attn_modules, as
// torchtune's KD configs do), else every weight; the teacher (teacher_model + teacher_checkpointer)
// is loaded once, frozen, in the run's dtype.
#include "fusetune/recipes/distillation_recipe.h"

#include <memory>

#include "fusetune/config/schema.h"
#include "fusetune/distributed/sharded_params.h"
#include "fusetune/recipes/kd_step.h"
#include "fusetune/recipes/kd_teacher_topk.h"
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

namespace {

LoadedModel load_teacher(const StepContext& ctx, const Config& tcfg, DType dtype) {
  LoadedModel teacher = load_model(tcfg, dtype);
  if (ctx.log)
    ctx.log("teacher: " + teacher.description + " (" +
            std::to_string(teacher.config.num_hidden_layers) + " layers, hidden " +
            std::to_string(teacher.config.hidden_size) + "), frozen");
  return teacher;
}

// The teacher's top-k over the training samples from teacher_logits.path: read when the file
// is there (the teacher is not loaded), else computed once by the teacher (rank 0 of a
// distributed run, the others waiting), written, and the teacher released.
std::shared_ptr<const TeacherTopK> precomputed_teacher(const StepContext& ctx, const Config& tcfg,
                                                       const TeacherLogitsOptions& topk,
                                                       DType dtype) {
  FT_CHECK(ctx.dataset, "teacher_logits.precompute needs the training samples");
  TeacherTopKKey key;
  key.top_k = topk.top_k;
  key.vocab_size = ctx.model.config.vocab_size;
  key.samples = ctx.dataset->size();
  key.dataset = dataset_fingerprint(*ctx.dataset);
  key.tokenizer = tokenizer_fingerprint(ctx.cfg);
  key.teacher = teacher_fingerprint(tcfg);
  const std::filesystem::path file = topk.file();
  const bool writer = !ctx.comm || ctx.comm->rank() == 0;
  if (writer && !std::filesystem::exists(file)) {
    const LoadedModel teacher = load_teacher(ctx, tcfg, dtype);
    if (ctx.log)
      ctx.log("teacher_logits: computing the teacher's top-" + std::to_string(topk.top_k) +
              " over " + std::to_string(key.samples) + " samples into " + file.string());
    write_teacher_topk(
        file, key, *ctx.dataset, ctx.loader.collate, ctx.loader.batch_size,
        teacher_top_k_of(teacher.config, teacher.params, topk.top_k, dtype, ctx.step.passes));
  }
  if (ctx.comm) ctx.comm->barrier("teacher_logits.precompute");
  auto t = std::make_shared<const TeacherTopK>(TeacherTopK::load(file, key));
  if (ctx.log)
    ctx.log("teacher: its top-" + std::to_string(topk.top_k) + " logits from " + file.string() +
            " (not loaded)");
  return t;
}

}  // namespace

TrainJob distillation_job(const Config& cfg, const std::string& recipe) {
  // Both architectures before any weight is read.
  const Config tcfg = teacher_config(cfg);
  check_same_vocabulary(model_architecture(cfg), model_architecture(tcfg));
  const bool lora = cfg.has("model.lora_attn_modules");
  TrainJob job;
  std::function<LinearFn(std::shared_ptr<KdStudentHead>)> head_parts;
  if (lora) {
    LoraJob lj = lora_training_job(cfg, recipe);
    job = std::move(lj.job);
    head_parts = std::move(lj.head_parts);
  } else {
    job.recipe = recipe;
    job.trainable = [](const std::string&) { return true; };
  }
  const std::optional<TeacherLogitsOptions> topk =
      teacher_logits_options(cfg, model_architecture(cfg).vocab_size);
  FT_CHECK(!topk || !topk->precompute || !cfg.has("dataset_val"),
           cfg.where("dataset_val") +
               ": validation with teacher_logits.precompute is not "
               "supported (the file covers the training samples only)");
  auto teacher = std::make_shared<LoadedModel>();
  auto teacher_shards = std::make_shared<std::unique_ptr<dist::ShardedParams>>();
  job.make_step = [teacher, teacher_shards, tcfg, head_parts, topk](const StepContext& ctx) {
    const DType dtype = ctx.model.params.begin()->second.dtype();
    KdStepOptions o;
    o.student = ctx.step;
    o.loss = distillation_loss_from(ctx.cfg);
    o.kd_ratio = ctx.cfg.f64("kd_ratio");
    o.head_parts = head_parts;
    if (topk) o.teacher_top_k = topk->top_k;
    if (topk && topk->precompute) {
      o.precomputed = precomputed_teacher(ctx, tcfg, *topk, dtype);
      return make_kd_step(std::move(o));
    }
    *teacher = load_teacher(ctx, tcfg, dtype);
    o.teacher = &teacher->config;
    o.teacher_params = &teacher->params;
    // ZeRO-3 (the student's parameters come from a sharded source): the frozen teacher is
    // sharded by the same partition, each rank keeping the weights it owns, each gathered
    // from its owner when the teacher's forward reaches it (as full DPO's reference copy).
    if (ctx.step.param_source && ctx.comm && ctx.comm->size() > 1) {
      *teacher_shards = std::make_unique<dist::ShardedParams>(*ctx.comm, teacher->params,
                                                              std::vector<std::string>{});
      (*teacher_shards)->release_others();
      o.teacher_source = (*teacher_shards)->source();
      if (ctx.log)
        ctx.log("teacher: sharded over " + std::to_string(ctx.comm->size()) +
                " ranks (zero_stage: 3)");
    }
    return make_kd_step(std::move(o));
  };
  return job;
}

int knowledge_distillation_single_device(const Config& cfg) {
  return run_training(cfg, distillation_job(cfg, "knowledge_distillation_single_device"));
}

}  // namespace fusetune
