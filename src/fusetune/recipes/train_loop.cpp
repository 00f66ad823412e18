// The training loop (docs/design.md §7), top to bottom: settings, setup (model, data, optimizer,
// resume, logger, step, gradient synchronization), then the step loop, then the checkpoints.
#include "fusetune/recipes/train_loop.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <set>

#include "fusetune/compile/compiler.h"
#include "fusetune/core/memory.h"
#include "fusetune/distributed/sharded_optimizer.h"
#include "fusetune/distributed/sharded_params.h"
#include "fusetune/kernels/cpu/bf16_matmul.h"
#include "fusetune/kernels/cpu/gemm_peak.h"
#include "fusetune/metrics/step_logger.h"
#include "fusetune/optim/grad_clip.h"
#include "fusetune/peft/parameter_count.h"
#include "fusetune/recipes/grad_sync.h"
#include "fusetune/recipes/recipe_setup.h"
#include "fusetune/recipes/registry.h"
#include "fusetune/recipes/step_plan.h"
#include "fusetune/recipes/test_only_faults.h"
#include "fusetune/recipes/train_settings.h"
#include "fusetune/recipes/training_checkpoint.h"
#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Why a step stops the run: what was not finite, the samples of its micro-batches (dataset
// indices, in loader order) and the checkpoint a resume would start from.
std::string non_finite_step_message(int64_t step, double loss, double norm,
                                    const std::vector<Batch>& micro,
                                    const std::filesystem::path& output_dir) {
  std::string what = !std::isfinite(loss) ? "the loss is " + std::to_string(loss)
                                          : "the gradient norm is " + std::to_string(norm);
  std::string items;
  for (const Batch& b : micro)
    for (int64_t i : b.items) items += (items.empty() ? "" : ", ") + std::to_string(i);
  const auto last = latest_resumable_checkpoint(output_dir);
  return "step " + std::to_string(step) + ": " + what +
         "; the update was not applied and the run stops (diverged: lower optimizer.lr or set "
         "clip_grad_norm). Its samples (dataset indices): [" +
         items + "]. Last complete checkpoint: " +
         (last ? last->string() + " (resume_from_checkpoint: true continues from it)"
               : std::string("none yet"));
}

// Everything a run holds, built by the setup functions below in this order.
struct Run {
  Run(const Config& c, const TrainJob& j, TrainSettings s) : cfg(c), job(j), set(std::move(s)) {}
  const Config& cfg;
  const TrainJob& job;
  const TrainSettings set;
  int rank = 0, world = 1;  // job.comm's; one process is rank 0 of 1
  int threads = 0;
  PassOptions passes;
  std::string planned_peak;
  // Model and data.
  LoadedModel model;
  std::unique_ptr<Tokenizer> tokenizer;  // the datasets may read it as they go
  LoaderOptions loader_options;
  std::unique_ptr<Dataset> dataset;
  std::unique_ptr<PreferenceDataset> pairs;
  std::unique_ptr<DataLoader> loader;
  std::unique_ptr<Dataset> val_dataset;
  std::unique_ptr<PreferenceDataset> val_pairs;
  std::unique_ptr<DataLoader> val_loader;
  int64_t steps_per_epoch = 0, total_steps = 0;
  // Optimizer and where training stands.
  std::vector<std::string> trainable;  // sorted
  std::vector<int64_t> trainable_numels;
  int64_t zero_stage = 0;  // 0 without ranks
  std::unique_ptr<Optimizer> optimizer;
  dist::ShardedOptimizer* sharded = nullptr;  // ZeRO-1, 2, 3: `optimizer`
  std::optional<LRSchedule> schedule;
  TrainingProgress progress;
  TensorMap grads;  // gradient accumulation buffers
  double lr = 0;    // the step's learning rate (optimizer_in_bwd updates inside step->run)
  std::string resumed_from;
  std::vector<std::string> skipped_checkpoints;  // damaged ones a resume passed over
  // Logging, ZeRO-3's parameters, the step and its gradient synchronization.
  std::unique_ptr<StepLogger> logger;
  double peak_gflops = 0;
  std::unique_ptr<dist::ShardedParams> zero3;
  std::unique_ptr<TrainingStep> step;
  std::optional<int64_t> test_only_inf_at;
  std::unique_ptr<GradSync> sync;
  // A step that updates itself (PPO): its updates' clipped gradient norms in this loop step.
  double inside_norm_sum = 0;
  int64_t inside_norms = 0;
};

// What one optimizer step did, for the log and the non-finite guard.
struct StepResult {
  std::vector<Batch> micro;
  double loss = 0;
  std::vector<StepMetric> metrics;
  std::optional<double> grad_norm;
  double compile_s = 0;
};

std::vector<ParamRef> param_refs(Run& r) {
  std::vector<ParamRef> refs;
  for (const auto& name : r.trainable)
    refs.push_back({name, &r.model.params.at(name), &r.grads[name]});
  return refs;
}

// Validation data (dataset_val): every batch, in order, each time validation runs.
void load_validation_data(Run& r, const Tokenizer& tokenizer) {
  if (!r.set.has_validation) return;
  LoaderOptions vo = r.loader_options;
  vo.num_shards = 1;  // validate() deals the batches out to the ranks
  vo.shard = 0;
  vo.shuffle = false;
  vo.drop_last = false;
  vo.batch_size = r.set.batch_size_val.value_or(r.loader_options.batch_size);
  if (r.job.preference_data) {
    r.val_pairs =
        build_preference_dataset_from_config(r.cfg, tokenizer, r.model.config, "dataset_val");
    r.val_loader = std::make_unique<DataLoader>(*r.val_pairs, vo);
  } else {
    r.val_dataset = build_dataset_from_config(r.cfg, tokenizer, r.model.config, "dataset_val");
    r.val_loader = std::make_unique<DataLoader>(*r.val_dataset, vo);
  }
}

void load_model_and_data(Run& r) {
  r.model = r.job.load_model ? r.job.load_model(r.set.dtype)
                             : load_model(r.cfg, r.set.dtype, r.job.sink.get());
  if (r.job.prepare) r.job.prepare(r.model);
  r.tokenizer = build_tokenizer(r.cfg);
  const Tokenizer* tokenizer = r.tokenizer.get();
  FT_CHECK(tokenizer->vocab_size() <= r.model.config.vocab_size,
           "the tokenizer has " + std::to_string(tokenizer->vocab_size()) +
               " tokens but the model's vocab_size is " +
               std::to_string(r.model.config.vocab_size));
  r.loader_options = loader_options_from(r.cfg, *tokenizer);
  r.loader_options.num_shards = r.world;
  r.loader_options.shard = r.rank;
  if (r.job.preference_data) {
    r.pairs = build_preference_dataset_from_config(r.cfg, *tokenizer, r.model.config);
    r.loader = std::make_unique<DataLoader>(*r.pairs, r.loader_options);
  } else {
    r.dataset = build_dataset_from_config(r.cfg, *tokenizer, r.model.config);
    r.loader = std::make_unique<DataLoader>(*r.dataset, r.loader_options);
  }
  load_validation_data(r, *tokenizer);
  r.steps_per_epoch = r.loader->steps_per_epoch() / r.set.grad_accum;
  if (auto cap = r.set.max_steps_per_epoch) r.steps_per_epoch = std::min(r.steps_per_epoch, *cap);
  FT_CHECK(r.steps_per_epoch >= 1,
           "the dataset yields " + std::to_string(r.loader->steps_per_epoch()) +
               " batches per epoch, fewer than gradient_accumulation_steps (" +
               std::to_string(r.set.grad_accum) + "): nothing to train on");
  r.total_steps = r.steps_per_epoch * r.set.epochs;
  if (r.set.num_steps) r.total_steps = std::min(r.total_steps, *r.set.num_steps);
}

// resume_from_checkpoint: the weights, optimizer state and progress of the latest checkpoint.
void resume_from_checkpoint(Run& r) {
  const std::filesystem::path& output_dir = r.set.output_dir;
  std::vector<std::string> damaged;
  auto dir = latest_resumable_checkpoint(output_dir, &damaged);
  FT_CHECK(dir, "resume_from_checkpoint is true but " + output_dir.string() +
                    " holds no resumable checkpoint" +
                    (damaged.empty() ? "" : " (damaged: " + join(damaged, "; ") + ")"));
  for (const std::string& d : damaged) r.skipped_checkpoints.push_back(d);
  const DType dtype = r.set.dtype;
  ResumedState s = r.job.load ? r.job.load(*dir, dtype) : load_training_checkpoint(*dir, dtype);
  // Another seed would shuffle the data differently: the run would silently not be the one
  // it claims to continue.
  FT_CHECK(s.progress.seed == r.progress.seed,
           "cannot resume from " + dir->string() + ": it was trained with seed " +
               std::to_string(s.progress.seed) + " but the config says seed " +
               std::to_string(r.progress.seed));
  for (auto& [name, t] : s.params) {
    auto it = r.model.params.find(name);
    FT_CHECK(it != r.model.params.end(),
             "checkpoint " + dir->string() + " has an unknown parameter '" + name + "'");
    // The loaders return the run's dtype (job.load's argument): anything else is a loader's
    // bug, named here rather than by the step graph.
    FT_CHECK(t.shape() == it->second.shape() && t.dtype() == it->second.dtype(),
             "cannot resume from " + dir->string() + ": parameter '" + name + "' loaded as " +
                 dtype_name(t.dtype()) + " " + shape_str(t.shape()) + " but the run's is " +
                 dtype_name(it->second.dtype()) + " " + shape_str(it->second.shape()));
    it->second = t;
  }
  r.optimizer->load_state(s.optimizer, param_refs(r));
  r.progress = s.progress;
  r.resumed_from = dir->string();
}

void build_optimizer_and_resume(Run& r) {
  for (const auto& [name, t] : r.model.params)
    if (r.job.trainable(name)) r.trainable.push_back(name);
  std::sort(r.trainable.begin(), r.trainable.end());
  for (const std::string& name : r.trainable)
    r.trainable_numels.push_back(r.model.params.at(name).numel());
  r.optimizer = build_optimizer(r.cfg);
  // zero_stage 1, 2, 3 (distributed recipes): each rank keeps the optimizer state of its share;
  // 2: and only its share of the summed gradients; 3: and only its share of the parameters.
  r.zero_stage = r.job.comm ? r.set.zero_stage : 0;
  FT_CHECK(
      r.zero_stage < 2 || !r.set.optimizer_in_bwd,
      "optimizer_in_bwd: true cannot be combined with zero_stage " + std::to_string(r.zero_stage));
  if (r.zero_stage >= 1) {
    auto s = std::make_unique<dist::ShardedOptimizer>(
        std::move(r.optimizer), *r.job.comm, r.trainable, r.trainable_numels, r.zero_stage < 3);
    r.sharded = s.get();
    r.optimizer = std::move(s);
  }
  r.schedule = build_lr_schedule(r.cfg, r.total_steps);
  r.progress.seed = r.set.seed;
  if (r.set.resume) resume_from_checkpoint(r);
}

void open_logger(Run& r) {
  StepLoggerOptions lo;
  if (r.rank == 0) lo.output_dir = r.set.output_dir;  // other ranks: no files, nothing printed
  lo.print = r.rank == 0;
  if (r.rank != 0) lo.progress = ProgressBar::Mode::Never;
  // metric_logger.log_dir: the files of disk, jsonl, tensorboard; tensorboard: event files too.
  if (r.set.metric_log_dir) lo.log_dir = *r.set.metric_log_dir;
  lo.tensorboard = r.set.metric_logger == "tensorboard";
  lo.total_steps = r.total_steps;
  r.logger = std::make_unique<StepLogger>(lo);
  RunHeader header;
  header.recipe = r.job.recipe;
  header.model = r.model.config.model_type + " (" + r.model.description + ")";
  const peft::ParameterCount counted = peft::count_parameters(r.model.params, r.job.trainable);
  header.params_total =
      counted.total + (r.job.params_stored_elsewhere ? r.job.params_stored_elsewhere() : 0);
  header.params_trainable = counted.trainable;
  header.threads = r.threads;
  header.dtype = r.set.dtype_text;
  if (r.set.dtype == DType::BF16)
    header.extra.push_back({"bf16_matmul", kernels::bf16_matmul_description()});
  header.compile_mode = compile_mode_name(r.passes.mode);
  const DatasetReport& data_report = r.pairs ? r.pairs->report() : r.dataset->report();
  header.extra.push_back({"dataset", data_report.summary()});
  if (r.world > 1)
    header.extra.push_back({"ranks", std::to_string(r.world) + " (data parallel; global batch " +
                                         std::to_string(r.loader_options.batch_size * r.world) +
                                         ")"});
  header.extra.push_back({"steps", std::to_string(r.total_steps) + " (" +
                                       std::to_string(r.steps_per_epoch) + " per epoch)"});
  r.peak_gflops = kernels::measure_peak_gemm_gflops(512);
  header.extra.push_back({"peak_gemm_gflops", std::to_string(int64_t(r.peak_gflops))});
  if (!r.planned_peak.empty()) header.extra.push_back({"planned_peak", r.planned_peak});
  if (!r.resumed_from.empty()) header.extra.push_back({"resumed_from", r.resumed_from});
  for (const std::string& d : r.skipped_checkpoints)
    header.extra.push_back({"skipped_damaged_checkpoint", d});
  r.logger->header(header);
  for (const std::string& w : optimizer_warnings(r.cfg)) r.logger->message(w);
  for (const std::string& w : cpu_notes(r.cfg)) r.logger->message(w);
  if (r.set.low_cpu_ram)
    r.logger->message(
        "low_cpu_ram: true changes nothing here: the weights are read through mmap by one "
        "process, with no per-rank state-dict copies to avoid (note: a merged QLoRA save still "
        "dequantizes the whole base to fp32 in RAM)");
}

// `at` is where a run resumed from this checkpoint continues.
void save_checkpoint(Run& r, const std::string& name, const TrainingProgress& at) {
  const std::filesystem::path& output_dir = r.set.output_dir;
  if (r.sharded) r.sharded->gather_state("gathering the optimizer state for checkpoint " + name);
  if (r.zero3)
    r.zero3->gather_to_rank0("gathering the parameters for checkpoint " + name, r.job.save_reads);
  if (r.rank != 0) {
    if (r.job.comm) r.job.comm->barrier("waiting for rank 0 to write checkpoint " + name);
    return;
  }
  CheckpointContent c;
  c.config = &r.model.config;
  c.params = &r.model.params;
  c.optimizer = r.optimizer.get();
  c.progress = at;
  c.save_dtype = r.set.save_dtype.value_or(r.set.dtype);  // default: the training dtype
  c.max_shard_bytes = r.set.max_shard_bytes;
  c.copy_files_from = r.model.checkpoint_dir;
  if (r.job.save)
    r.job.save(output_dir / name, c);
  else
    save_training_checkpoint(output_dir / name, c);
  if (r.sharded) r.sharded->drop_gathered_state();
  if (r.zero3) r.zero3->release_others();
  r.logger->message("Saved checkpoint to " + (output_dir / name).string());
  if (const std::optional<int64_t> keep = r.set.keep_last_n)
    for (const auto& gone : prune_checkpoints(output_dir, output_dir / name, *keep))
      r.logger->message("Removed checkpoint " + gone.string() +
                        " (keep_last_n_checkpoints: " + std::to_string(*keep) + ")");
  if (r.job.comm) r.job.comm->barrier("writing checkpoint " + name);
}

// TEST-ONLY (test_only_faults.h): before the guard stops the run, the weights and state as
// they are go to a checkpoint.
void test_only_save_at_stop(Run& r) {
  if (r.test_only_inf_at) save_checkpoint(r, test_only::kStoppedCheckpoint, r.progress);
}

// optimizer_in_bwd: each parameter is updated as soon as the backward has computed its
// gradient, which is then freed; all the gradients are never held at once.
void update_in_backward(Run& r) {
  const bool ok = r.step->stream_gradients(
      [&r, trainable_set = std::set<std::string>(r.trainable.begin(), r.trainable.end())](
          const std::string& name, Tensor grad) {
        if (!trainable_set.count(name)) return;
        ParamRef ref{name, &r.model.params.at(name), &grad};
        // A non-finite gradient is never applied (the parameters updated before it in this
        // step already are: the run stops and resumes from the last checkpoint).
        const double norm = fusetune::grad_norm({ref});
        if (!std::isfinite(norm)) {
          test_only_save_at_stop(r);
          const auto last = latest_resumable_checkpoint(r.set.output_dir);
          throw Error("step " + std::to_string(r.progress.global_step + 1) + ": the gradient of '" +
                      name + "' is not finite (norm " + std::to_string(norm) +
                      "); with optimizer_in_bwd the parameters updated before it in this step "
                      "already changed, so the run stops (diverged: lower optimizer.lr). Last "
                      "complete checkpoint: " +
                      (last ? last->string() + " (resume_from_checkpoint: true continues from it)"
                            : std::string("none yet")));
        }
        r.optimizer->step({ref}, r.lr);
      });
  FT_CHECK(ok, "optimizer_in_bwd: true is not supported by the " + r.job.recipe +
                   " recipe (its step cannot hand over gradients during the backward)");
  r.logger->message(
      "optimizer_in_bwd: each parameter is updated as soon as its gradient is computed and "
      "the gradient freed; grad_norm is not logged (no step sees all the gradients)");
}

void apply_update_inside_step(Run& r, std::vector<std::pair<std::string, Tensor>> grads);

// The step (ZeRO-3: over sharded parameters), how it updates and how its gradients are summed.
void build_step(Run& r) {
  // ZeRO-3: each rank keeps only its share of the parameters (freed before training).
  if (r.zero_stage == 3)
    r.zero3 = std::make_unique<dist::ShardedParams>(*r.job.comm, r.model.params, r.trainable,
                                                    r.job.shard_stored_elsewhere
                                                        ? r.job.shard_stored_elsewhere()
                                                        : std::map<std::string, Tensor*>{});
  StepLogger& logger = *r.logger;
  StepContext ctx{
      r.cfg,         r.model,          {},
      r.pairs.get(), r.loader_options, [&logger](const std::string& line) { logger.message(line); },
      r.job.comm};
  ctx.dataset = r.dataset.get();
  ctx.val_dataset = r.val_dataset.get();
  ctx.step.model = &r.model.config;
  ctx.step.params = &r.model.params;
  ctx.step.trainable = r.job.trainable;
  ctx.step.llama = r.job.llama;
  ctx.step.eval_llama = r.job.eval_llama;
  ctx.step.passes = r.passes;
  if (r.zero3) {
    ctx.step.param_source = r.zero3->source();
    ctx.step.passes.params_at_use = true;
    ctx.step.passes.reshard_after_forward = r.set.reshard_after_forward;
  }
  ctx.step.dtype = r.set.dtype;
  ctx.step.add_inputs = r.job.add_inputs;
  ctx.apply_update = [&r](std::vector<std::pair<std::string, Tensor>> grads) {
    apply_update_inside_step(r, std::move(grads));
  };
  r.step = r.job.make_step ? r.job.make_step(ctx) : make_sft_step(ctx.step);
  // TEST-ONLY (test_only_faults.h): a +inf gradient at a chosen step, for the guard's test.
  r.test_only_inf_at = test_only::inf_gradient_step();
  if (r.test_only_inf_at)
    r.step =
        test_only::with_inf_gradient(std::move(r.step), *r.test_only_inf_at, r.rank == r.world - 1);
  if (r.set.optimizer_in_bwd) update_in_backward(r);
  GradSyncContext c;
  c.comm = r.job.comm;
  c.rank = r.rank;
  c.world = r.world;
  c.trainable = &r.trainable;
  c.trainable_numels = &r.trainable_numels;
  c.grads = &r.grads;
  if (r.set.bucket_elements > 0) c.bucket_elements = r.set.bucket_elements;
  c.log = [&logger](const std::string& line) { logger.message(line); };
  r.sync = choose_grad_sync(c, *r.step, r.zero_stage, r.set.overlap_grad_allreduce.value_or(false),
                            r.set.optimizer_in_bwd, r.job.recipe);
}

// Mean loss over the validation data per loss unit (torchtune's val_loss), logged on its own
// line and in metrics.jsonl. Ranks: validation batch k is rank k % world's (each sample once,
// batched as in one process), and the loss sums and units are all-reduced, so the value is the
// global one.
void run_validation(Run& r) {
  const int64_t batches = r.val_loader->steps_per_epoch();
  double sums[2] = {0, 0};  // loss, loss units
  for (int64_t k = r.rank; k - r.rank < batches; k += r.world) {
    // ZeRO-3 gathers the parameters collectively in every forward: a rank short of batches
    // evaluates its first one again and drops the result, so all run as many forwards.
    const bool extra = k >= batches;
    if (extra && !r.zero3) break;
    r.val_loader->set_state({0, extra ? r.rank % batches : k});
    const Batch b = r.val_loader->next();
    const double loss = r.step->evaluate(b);
    if (extra) continue;
    sums[0] += loss;
    sums[1] += double(r.step->loss_units(b));
  }
  if (r.job.comm && r.world > 1)
    r.job.comm->allreduce_sum(
        sums, 2,
        "the validation loss all-reduce at step " + std::to_string(r.progress.global_step));
  const double val_loss = sums[1] > 0 ? sums[0] / sums[1] : std::nan("");
  r.logger->log_values(r.progress.global_step, {{"val_loss", val_loss}});
}

// Ranks: the step's loss, metric sums and counts summed over the ranks; clipping and the update
// then see the global values (docs/design.md §7: accumulate -> reduce -> clip).
void sum_scalars_over_ranks(Run& r, StepResult& s, const std::string& at_step) {
  std::vector<double> scalars = {s.loss};
  for (const StepMetric& mv : s.metrics) {
    scalars.push_back(mv.sum);
    scalars.push_back(mv.count);
  }
  r.job.comm->allreduce_sum(scalars.data(), int64_t(scalars.size()),
                            "the loss all-reduce" + at_step);
  s.loss = scalars[0];
  for (size_t i = 0; i < s.metrics.size(); ++i) {
    s.metrics[i].sum = scalars[1 + 2 * i];
    s.metrics[i].count = scalars[2 + 2 * i];
  }
}

// The update: a non-finite loss or gradient is never applied to the weights (clip_grad_norm
// leaves non-finite gradients untouched and returns their norm).
void apply_update(Run& r, StepResult& s, bool inside_step = false) {
  const int64_t step = r.progress.global_step + 1;
  // The parameters are already updated (optimizer_in_bwd, finite gradients; or a step that
  // updates itself): only the loss is left to check.
  const bool applied = r.set.optimizer_in_bwd || (r.step->updates_itself() && !inside_step);
  if (applied) {
    if (std::isfinite(s.loss)) return;
    test_only_save_at_stop(r);
    std::string msg = non_finite_step_message(step, s.loss, 0, s.micro, r.set.output_dir);
    const std::string not_applied = "the update was not applied";
    const size_t at = msg.find(not_applied);
    if (at != std::string::npos)
      msg.replace(at, not_applied.size(),
                  r.set.optimizer_in_bwd ? "the update was already applied (optimizer_in_bwd)"
                                         : "the step's updates were already applied");
    throw Error(msg);
  }
  std::vector<ParamRef> refs = param_refs(r);
  const double norm = r.sync->norm(refs, r.set.clip_grad_norm);
  if (!std::isfinite(s.loss) || !std::isfinite(norm)) {
    test_only_save_at_stop(r);
    throw Error(non_finite_step_message(step, s.loss, norm, s.micro, r.set.output_dir));
  }
  if (r.set.clip_grad_norm) s.grad_norm = norm;
  r.optimizer->step(refs, r.lr);
  r.grads.clear();
}

// StepContext::apply_update: one update inside the step (TrainingStep::updates_itself) with
// its gradients, summed over the ranks as a loop step's are (ZeRO-2: reduced into their
// owners, in name order on every rank), through the loop's clip, guard and optimizer.
void apply_update_inside_step(Run& r, std::vector<std::pair<std::string, Tensor>> grads) {
  std::sort(grads.begin(), grads.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [name, g] : grads) r.sync->add(name, std::move(g), 0);
  r.sync->end_micro_batches();
  if (r.job.comm && r.world > 1) r.sync->reduce();
  StepResult s;
  s.loss = 0;
  apply_update(r, s, /*inside_step=*/true);
  if (s.grad_norm) {
    r.inside_norm_sum += *s.grad_norm;
    ++r.inside_norms;
  }
}

// One optimizer step: its micro-batches' forward and backward, the gradients accumulated and
// summed over the ranks, the update. The loss is normalized by the loss units (tokens, pairs) of
// the whole optimizer step (ranks: over all ranks, not per rank).
StepResult train_step(Run& r, const std::string& at_step) {
  StepResult s;
  int64_t units = 0;
  for (int64_t k = 0; k < r.set.grad_accum; ++k) s.micro.push_back(r.loader->next());
  r.step->begin_step(s.micro, r.progress.global_step);
  for (const Batch& b : s.micro) units += r.step->loss_units(b);
  if (r.job.comm) r.job.comm->allreduce_sum(&units, 1, "the loss-unit all-reduce" + at_step);
  const double scale = units > 0 ? 1.0 / double(units) : 0.0;
  r.lr = r.schedule->lr_at(r.progress.global_step);
  r.sync->begin_step(*r.step, s.micro, at_step);
  for (size_t k = 0; k < s.micro.size(); ++k) {
    StepOutputs out =
        r.sync->run_micro(*r.step, s.micro[k], scale, r.progress.global_step, k, s.micro.size());
    s.loss += out.loss;
    for (auto& [name, g] : out.grads) r.sync->add(name, std::move(g), k);
    // Metric sums and counts add up over the micro-batches.
    if (k == 0) s.metrics.assign(out.metrics.size(), {});
    for (size_t i = 0; i < out.metrics.size(); ++i) {
      s.metrics[i].name = out.metrics[i].name;
      s.metrics[i].difference_of = out.metrics[i].difference_of;
      s.metrics[i].sum += out.metrics[i].sum;
      s.metrics[i].count += out.metrics[i].count;
    }
  }
  r.sync->end_micro_batches();
  if (r.job.comm && r.world > 1) {
    sum_scalars_over_ranks(r, s, at_step);
    r.sync->reduce();
  }
  s.compile_s = r.step->take_compile_seconds();
  apply_update(r, s);
  // A step that updated itself logs its updates' mean gradient norm (clip_grad_norm).
  if (r.inside_norms > 0) s.grad_norm = r.inside_norm_sum / double(r.inside_norms);
  r.inside_norm_sum = 0;
  r.inside_norms = 0;
  return s;
}

// A metric's logged value: sum / count over the step (0 without a count), or the difference of
// two such values (StepMetric::difference_of).
double metric_value(const StepResult& s, const StepMetric& mv) {
  auto mean = [](const StepMetric& x) { return x.count > 0 ? x.sum / x.count : 0.0; };
  if (mv.difference_of.first.empty()) return mean(mv);
  const StepMetric *a = nullptr, *b = nullptr;
  for (const StepMetric& x : s.metrics) {
    if (x.name == mv.difference_of.first) a = &x;
    if (x.name == mv.difference_of.second) b = &x;
  }
  FT_CHECK(a && b, "metric " + mv.name + " is the difference of metrics the step does not log");
  return a->count > 0 && b->count > 0 ? mean(*a) - mean(*b) : 0.0;
}

// The step's line (every log_every_n_steps, and the first); the time counters are taken every
// step.
void log_step(Run& r, const StepResult& s, double step_s) {
  const int64_t step = r.progress.global_step;
  const double comm_s = r.job.comm ? r.job.comm->take_comm_seconds() : 0.0;
  const int64_t new_gather_buffers = r.zero3 ? r.zero3->take_new_gather_buffers() : 0;
  const std::optional<double> comm_wait_s = r.sync->comm_wait_seconds(comm_s);
  if (step % r.set.log_every != 0 && step != 1) return;
  int64_t tokens = 0;
  for (const Batch& b : s.micro) tokens += r.step->trained_tokens(b);  // this rank's
  StepMetrics m;
  m.step = step;
  m.epoch = r.progress.epoch + 1;
  m.loss = s.loss;
  m.lr = r.lr;
  m.tokens_per_second_per_gpu = double(tokens) / step_s;
  if (r.set.log_peak_memory) m.peak_memory_alloc_bytes = memory::peak_bytes();
  m.grad_norm = s.grad_norm;
  double flops = 0;
  for (const Batch& b : s.micro) flops += r.step->flops(b);
  for (const StepMetric& mv : s.metrics) m.extra.push_back({mv.name, metric_value(s, mv), 4});
  m.extra.push_back({"mfu", flops / step_s / (r.peak_gflops * 1e9), 3});
  if (s.compile_s > 0) m.extra.push_back({"compile_s", s.compile_s, 3});
  // Ranks: rank 0's time in collectives this step, waiting for the others included.
  if (r.world > 1) m.extra.push_back({"comm_s", comm_s, 3});
  // ZeRO-3: rank 0's gather buffers allocated this step (0 once its pool is warm).
  if (r.zero3 && r.world > 1)
    m.extra.push_back({"gather_new_buffers", double(new_gather_buffers), 0});
  // overlap_grad_allreduce: what of it the step waited for (the rest ran during the backward).
  if (comm_wait_s) m.extra.push_back({"comm_wait_s", *comm_wait_s, 3});
  r.logger->log(m);
}

}  // namespace

int run_training(const Config& cfg, const TrainJob& job) {
  // ---- settings (parsed once), the memory check, then setup ----------------------------------
  TrainSettings settings = parse_train_settings(cfg, *find_recipe(job.recipe).schema);
  if (job.adjust_settings) job.adjust_settings(settings);
  Run r(cfg, job, std::move(settings));
  const TrainSettings& set = r.set;
  r.threads = configure_threads(cfg);
  r.passes.mode = set.compile;
  r.passes.activation_checkpointing = set.activation_checkpointing;
  // The plan's peak against the available memory, before loading.
  r.planned_peak = check_run_fits_memory(cfg, job.recipe);
  r.rank = job.comm ? job.comm->rank() : 0;
  r.world = job.comm ? job.comm->size() : 1;
  FT_CHECK(r.world == 1 || !set.optimizer_in_bwd,
           "optimizer_in_bwd: true is not supported with more than one rank (each update needs "
           "the gradient summed over the ranks first); set optimizer_in_bwd: false");
  load_model_and_data(r);
  build_optimizer_and_resume(r);
  open_logger(r);
  build_step(r);

  // ---- train ----------------------------------------------------------------------------------
  TrainingProgress& p = r.progress;
  if (r.zero3) r.zero3->release_others();
  // num_steps may end the run inside an epoch: its checkpoint is that epoch's.
  for (; p.epoch < set.epochs && p.global_step < r.total_steps; ++p.epoch, p.step_in_epoch = 0) {
    if (p.step_in_epoch == 0)
      r.loader->set_state({p.epoch, 0});
    else
      r.loader->set_state(p.loader);
    for (; p.step_in_epoch < r.steps_per_epoch && p.global_step < r.total_steps;
         ++p.step_in_epoch) {
      memory::reset_peak();
      const auto t0 = Clock::now();
      const StepResult s = train_step(r, " of step " + std::to_string(p.global_step + 1));
      ++p.global_step;
      log_step(r, s, seconds_since(t0));
      r.logger->progress(p.epoch + 1, p.global_step, s.loss);
      if (r.val_loader && set.val_every && p.global_step % *set.val_every == 0) run_validation(r);
      if (set.save_every && p.global_step % *set.save_every == 0 &&
          p.step_in_epoch + 1 < r.steps_per_epoch) {
        TrainingProgress at = p;
        at.step_in_epoch += 1;
        at.loader = r.loader->state();
        save_checkpoint(r, "step_" + std::to_string(p.global_step), at);
      }
    }
    if (r.val_loader && !set.val_every) run_validation(r);  // no cadence: at the end of each epoch
    TrainingProgress at = p;
    at.epoch += 1;
    at.step_in_epoch = 0;
    at.loader = {at.epoch, 0};
    save_checkpoint(r, "epoch_" + std::to_string(p.epoch), at);
  }
  r.logger->close();
  return 0;
}

}  // namespace fusetune
