// knowledge_distillation_single_device: the shared training loop (train_loop.h) with the KD
// step (kd_step.h); knowledge_distillation_distributed runs the same job as ranks. The student is
// LoRA adapters on a frozen base when `model` names LoRA keys (model.lora_attn_modules, as
// torchtune's KD configs do), else every weight; the teacher (teacher_model + teacher_checkpointer)
// is loaded once, frozen, in the run's dtype.
#include "fusetune/recipes/distillation_recipe.h"

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fusetune/config/schema.h"
#include "fusetune/distributed/sharded_optimizer.h"
#include "fusetune/distributed/sharded_params.h"
#include "fusetune/models/parameters.h"
#include "fusetune/models/training_graph.h"
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

LoadedModel load_teacher(const StepContext& ctx, const Config& tcfg, DType dtype,
                         ParamSink* sink = nullptr) {
  LoadedModel teacher = load_model(tcfg, dtype, sink);
  if (ctx.log)
    ctx.log("teacher: " + teacher.description + " (" +
            std::to_string(teacher.config.num_hidden_layers) + " layers, hidden " +
            std::to_string(teacher.config.hidden_size) + "), frozen");
  return teacher;
}

// Under `compile: true`, one line on whether the step fuses the heads with the loss (kd_step.h).
void log_kd_heads(const StepContext& ctx, const ModelConfig& teacher, const KdStepOptions& o) {
  if (!ctx.log || ctx.step.passes.mode != CompileMode::Full) return;
  const std::string t = o.teacher_top_k > 0 ? "the teacher's top-k" : "the teacher's head";
  if (kd_fuses_heads(CompileMode::Full, ctx.step.llama, ctx.model.config, teacher,
                     bool(o.head_parts), o.teacher_top_k > 0))
    ctx.log("kd: the student's head and " + t +
            " run inside the fused divergence (no [tokens x vocab] logits)");
  else
    ctx.log(
        "kd: the logits are materialized (a soft-capped student, or a head hook without parts)");
}

// The parameters of a ZeRO-3 teacher that other ranks own: taken as it loads and never read,
// so that each rank holds only its share (and one tensor at a time while loading).
class OtherRanksTeacherWeights final : public ParamSink {
 public:
  explicit OtherRanksTeacherWeights(const std::map<std::string, dist::HeldByOtherRank>& held)
      : held_(held) {}
  bool takes(const std::string& name) const override { return held_.count(name) > 0; }
  void put(const std::string&, const Shape&, const ElementSource&) override {}

 private:
  const std::map<std::string, dist::HeldByOtherRank>& held_;
};

// The teacher's weights other ranks own, by ShardedParams' partition of frozen parameters
// (name order, balanced by element count), from its architecture alone.
std::map<std::string, dist::HeldByOtherRank> teacher_held_by_others(
    const Config& tcfg, DType dtype, const dist::Communicator& comm) {
  std::map<std::string, Shape> shapes;
  for (const ParamInfo& p :
       graph_parameters(build_logits_graph(model_architecture(tcfg), 1, 1, dtype)))
    shapes[p.name] = p.shape;
  std::vector<int64_t> numels;
  for (const auto& [name, shape] : shapes) numels.push_back(shape_numel(shape));
  const std::vector<int> owner = dist::partition_by_elements(numels, comm.size());
  std::map<std::string, dist::HeldByOtherRank> held;
  size_t i = 0;
  for (const auto& [name, shape] : shapes)
    if (owner[i++] != comm.rank()) held[name] = {shape, dtype};
  return held;
}

// ZeRO-3: the frozen teacher sharded like the student (and like full DPO's reference copy),
// each rank loading only the weights it owns; each is gathered from its owner when the
// teacher's forward reaches it.
std::unique_ptr<dist::ShardedParams> load_teacher_share(const StepContext& ctx, const Config& tcfg,
                                                        DType dtype, LoadedModel& teacher) {
  const std::map<std::string, dist::HeldByOtherRank> held =
      teacher_held_by_others(tcfg, dtype, *ctx.comm);
  OtherRanksTeacherWeights skip(held);
  teacher = load_teacher(ctx, tcfg, dtype, &skip);
  auto shards =
      std::make_unique<dist::ShardedParams>(*ctx.comm, teacher.params, std::vector<std::string>{},
                                            std::map<std::string, Tensor*>{}, held);
  if (ctx.log)
    ctx.log("teacher: sharded over " + std::to_string(ctx.comm->size()) +
            " ranks (zero_stage: 3), each loading only its share: this rank holds " +
            std::to_string(teacher.params.size()) + " of " +
            std::to_string(teacher.params.size() + held.size()) + " weights");
  return shards;
}

// The run's key for a precomputed file over `d`.
TeacherTopKKey topk_key_of(const StepContext& ctx, const Config& tcfg,
                           const TeacherLogitsOptions& topk, const Dataset& d) {
  TeacherTopKKey key;
  key.top_k = topk.top_k;
  key.vocab_size = ctx.model.config.vocab_size;
  key.samples = d.size();
  key.dataset = dataset_fingerprint(d);
  key.tokenizer = tokenizer_fingerprint(ctx.cfg);
  key.teacher = teacher_fingerprint(tcfg);
  return key;
}

// Waits for `file` to appear (written atomically by another rank): computing it may take
// longer than dist_timeout_seconds, a collective's limit. A failing rank exits, and the
// launcher stops the others.
void wait_for_topk_file(const std::filesystem::path& file) {
  while (!std::filesystem::exists(file))
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
}

// Computes the precomputed file over d. Over ranks each rank loads the teacher and computes
// its share of the batches (batch k: rank k % ranks; the batches of one process with the
// global batch) into a part file; rank 0 merges the parts into the one-process file.
void compute_topk_file(const StepContext& ctx, const TopKOfBatch& top_k_of, const Dataset& d,
                       const std::filesystem::path& file, const TeacherTopKKey& key) {
  const int ranks = ctx.comm ? ctx.comm->size() : 1, rank = ctx.comm ? ctx.comm->rank() : 0;
  const int64_t rows = ctx.loader.batch_size * ranks;
  if (ctx.log)
    ctx.log("teacher_logits: computing the teacher's top-" + std::to_string(key.top_k) + " over " +
            std::to_string(key.samples) + " samples into " + file.string() +
            (ranks > 1 ? " (" + std::to_string(ranks) + " ranks, each its share)" : ""));
  if (ranks == 1) {
    write_teacher_topk(file, key, d, ctx.loader.collate, rows, top_k_of);
    return;
  }
  write_teacher_topk_part(file, key, d, ctx.loader.collate, rows, rank, ranks, top_k_of);
  if (rank != 0) return;
  for (int r = 0; r < ranks; ++r) wait_for_topk_file(teacher_topk_part_file(file, r, ranks));
  merge_teacher_topk_parts(file, key, rows, ranks);
}

// The precomputed files of a run: the training samples' and, with dataset_val, the
// validation samples' (each keyed by its own dataset's fingerprint).
struct PrecomputedTopK {
  std::shared_ptr<const TeacherTopK> train, val;
};

// The teacher's top-k over the training samples and the validation samples (when the run has
// them) from teacher_logits.path: read when the files are there (the teacher is not loaded),
// else computed once by the teacher (over ranks, each rank its share), written, and the
// teacher released.
PrecomputedTopK precomputed_teacher(const StepContext& ctx, const Config& tcfg,
                                    const TeacherLogitsOptions& topk, DType dtype) {
  FT_CHECK(ctx.dataset, "teacher_logits.precompute needs the training samples");
  struct Wanted {
    const Dataset* d;
    std::filesystem::path file;
    TeacherTopKKey key;
  };
  std::vector<Wanted> files{{ctx.dataset, topk.file(), topk_key_of(ctx, tcfg, topk, *ctx.dataset)}};
  if (ctx.val_dataset)
    files.push_back(
        {ctx.val_dataset, topk.val_file(), topk_key_of(ctx, tcfg, topk, *ctx.val_dataset)});
  const bool multi = ctx.comm && ctx.comm->size() > 1, writer = !multi || ctx.comm->rank() == 0;
  // Every rank sees the same answer: a file appears only after every rank has asked.
  std::vector<const Wanted*> missing;
  for (const Wanted& w : files)
    if (!std::filesystem::exists(w.file)) missing.push_back(&w);
  if (!missing.empty()) {
    if (multi) {
      // Parts a stopped run left are computed again.
      if (writer)
        for (const Wanted* w : missing)
          for (int r = 0; r < ctx.comm->size(); ++r)
            std::filesystem::remove(teacher_topk_part_file(w->file, r, ctx.comm->size()));
      ctx.comm->barrier("teacher_logits.precompute (the start)");
    }
    const LoadedModel teacher = load_teacher(ctx, tcfg, dtype);
    PassOptions passes = ctx.step.passes;
    passes.params_at_use = false;  // each rank holds the whole teacher while it computes
    const TopKOfBatch top_k_of =
        teacher_top_k_of(teacher.config, teacher.params, topk.top_k, dtype, passes);
    for (const Wanted* w : missing) compute_topk_file(ctx, top_k_of, *w->d, w->file, w->key);
  }
  if (!writer)
    for (const Wanted& w : files) wait_for_topk_file(w.file);
  if (ctx.comm) ctx.comm->barrier("teacher_logits.precompute");
  PrecomputedTopK out;
  out.train = std::make_shared<const TeacherTopK>(TeacherTopK::load(files[0].file, files[0].key));
  if (files.size() > 1)
    out.val = std::make_shared<const TeacherTopK>(TeacherTopK::load(files[1].file, files[1].key));
  if (ctx.log)
    ctx.log("teacher: its top-" + std::to_string(topk.top_k) + " logits from " +
            files[0].file.string() + (out.val ? " and " + files[1].file.string() : "") +
            " (not loaded)");
  return out;
}

}  // namespace

TrainJob distillation_job(const Config& cfg, const std::string& recipe) {
  // Both architectures before any weight is read.
  const Config tcfg = teacher_config(cfg);
  check_same_vocabulary(model_architecture(cfg), model_architecture(tcfg));
  const bool lora = cfg.has("model.lora_attn_modules");
  TrainJob job;
  std::function<LinearFn(std::shared_ptr<KdStudentHead>)> head_parts, eval_head_parts;
  if (lora) {
    LoraJob lj = lora_training_job(cfg, recipe);
    job = std::move(lj.job);
    head_parts = std::move(lj.head_parts);
    eval_head_parts = std::move(lj.eval_head_parts);
  } else {
    job.recipe = recipe;
    job.trainable = [](const std::string&) { return true; };
  }
  const std::optional<TeacherLogitsOptions> topk =
      teacher_logits_options(cfg, model_architecture(cfg).vocab_size);
  auto teacher = std::make_shared<LoadedModel>();
  auto teacher_shards = std::make_shared<std::unique_ptr<dist::ShardedParams>>();
  job.make_step = [teacher, teacher_shards, tcfg, head_parts, eval_head_parts,
                   topk](const StepContext& ctx) {
    const DType dtype = ctx.model.params.begin()->second.dtype();
    KdStepOptions o;
    o.student = ctx.step;
    o.loss = distillation_loss_from(ctx.cfg);
    o.kd_ratio = ctx.cfg.f64("kd_ratio");
    o.head_parts = head_parts;
    o.eval_head_parts = eval_head_parts;
    if (topk) o.teacher_top_k = topk->top_k;
    if (topk && topk->precompute) {
      const PrecomputedTopK files = precomputed_teacher(ctx, tcfg, *topk, dtype);
      o.precomputed = files.train;
      o.precomputed_val = files.val;
      log_kd_heads(ctx, ctx.model.config, o);
      return make_kd_step(std::move(o));
    }
    // ZeRO-3 (the student's parameters come from a sharded source): the teacher too.
    if (ctx.step.param_source && ctx.comm && ctx.comm->size() > 1) {
      *teacher_shards = load_teacher_share(ctx, tcfg, dtype, *teacher);
      o.teacher_source = (*teacher_shards)->source();
    } else {
      *teacher = load_teacher(ctx, tcfg, dtype);
    }
    o.teacher = &teacher->config;
    o.teacher_params = &teacher->params;
    log_kd_heads(ctx, teacher->config, o);
    return make_kd_step(std::move(o));
  };
  return job;
}

int knowledge_distillation_single_device(const Config& cfg) {
  return run_training(cfg, distillation_job(cfg, "knowledge_distillation_single_device"));
}

}  // namespace fusetune
