#include "fusetune/recipes/train_loop.h"

#include <chrono>
#include <cmath>
#include <map>
#include <set>

#include "fusetune/compile/compiler.h"
#include "fusetune/config/schema.h"
#include "fusetune/core/memory.h"
#include "fusetune/distributed/grad_allreduce.h"
#include "fusetune/distributed/grad_stream.h"
#include "fusetune/distributed/owned_gradients.h"
#include "fusetune/distributed/sharded_optimizer.h"
#include "fusetune/distributed/sharded_params.h"
#include "fusetune/kernels/cpu/bf16_matmul.h"
#include "fusetune/kernels/cpu/gemm_peak.h"
#include "fusetune/metrics/step_logger.h"
#include "fusetune/optim/grad_clip.h"
#include "fusetune/peft/parameter_count.h"
#include "fusetune/recipes/recipe_setup.h"
#include "fusetune/recipes/step_plan.h"
#include "fusetune/recipes/test_only_faults.h"
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

}  // namespace

int run_training(const Config& cfg, const TrainJob& job) {
  // ---- settings ---------------------------------------------------------------------------
  const std::filesystem::path output_dir = cfg.str("output_dir");
  const DType dtype = parse_dtype(cfg.str("dtype", "fp32"));
  const int threads = configure_threads(cfg);
  PassOptions passes;
  passes.mode = parse_compile_mode(cfg.str("compile", "false"));
  passes.activation_checkpointing = cfg.boolean("enable_activation_checkpointing", false);
  const int64_t epochs = cfg.i64("epochs", 1);
  const int64_t grad_accum = cfg.i64("gradient_accumulation_steps", 1);
  const int64_t log_every = cfg.i64("log_every_n_steps", 1);
  const bool log_memory = cfg.boolean("log_peak_memory_stats", true);
  const std::optional<double> clip = cfg.opt_f64("clip_grad_norm");
  const std::optional<int64_t> save_every = cfg.opt_i64("save_every_n_steps");
  const std::optional<int64_t> keep_last_n = cfg.opt_i64("checkpointer.keep_last_n_checkpoints");
  FT_CHECK(!keep_last_n || *keep_last_n >= 1,
           "checkpointer.keep_last_n_checkpoints must be >= 1, got " +
               std::to_string(keep_last_n.value_or(0)));
  FT_CHECK(epochs >= 1 && grad_accum >= 1 && log_every >= 1,
           "epochs, gradient_accumulation_steps and log_every_n_steps must be >= 1");
  // optimizer_in_bwd: each parameter is updated as soon as the backward has computed its
  // gradient, which is then freed; all the gradients are never held at once.
  const bool in_bwd = cfg.boolean("optimizer_in_bwd", false);
  FT_CHECK(!in_bwd || !clip,
           "clip_grad_norm cannot be combined with optimizer_in_bwd: true: clipping scales every "
           "gradient by the global gradient norm, which needs all the gradients before any "
           "parameter is updated, while optimizer_in_bwd updates each parameter as soon as its "
           "gradient is ready (torchtune refuses the combination too); remove clip_grad_norm "
           "or set optimizer_in_bwd: false");
  FT_CHECK(!in_bwd || grad_accum == 1,
           "optimizer_in_bwd: true needs gradient_accumulation_steps: 1 (got " +
               std::to_string(grad_accum) +
               "): each parameter is updated as soon as its gradient is ready, so gradients "
               "cannot be summed over micro-batches first (as in torchtune)");

  // ---- memory check: the plan's peak against the available memory, before loading ---------
  const std::string planned_peak = check_run_fits_memory(cfg, job.recipe);
  // Ranks (job.comm): one process is rank 0 of 1.
  const int rank = job.comm ? job.comm->rank() : 0;
  const int world = job.comm ? job.comm->size() : 1;
  FT_CHECK(world == 1 || !in_bwd,
           "optimizer_in_bwd: true is not supported with more than one rank (each update needs "
           "the gradient summed over the ranks first); set optimizer_in_bwd: false");

  // ---- model, tokenizer, data -------------------------------------------------------------
  LoadedModel model = load_model(cfg, dtype, job.sink.get());
  if (job.prepare) job.prepare(model);
  auto tokenizer = build_tokenizer(cfg);
  FT_CHECK(tokenizer->vocab_size() <= model.config.vocab_size,
           "the tokenizer has " + std::to_string(tokenizer->vocab_size()) +
               " tokens but the model's vocab_size is " + std::to_string(model.config.vocab_size));
  LoaderOptions loader_options = loader_options_from(cfg, *tokenizer);
  loader_options.num_shards = world;
  loader_options.shard = rank;
  std::unique_ptr<Dataset> dataset;
  std::unique_ptr<PreferenceDataset> pairs;
  std::unique_ptr<DataLoader> loader_ptr;
  if (job.preference_data) {
    pairs = build_preference_dataset_from_config(cfg, *tokenizer, model.config);
    loader_ptr = std::make_unique<DataLoader>(*pairs, loader_options);
  } else {
    dataset = build_dataset_from_config(cfg, *tokenizer, model.config);
    loader_ptr = std::make_unique<DataLoader>(*dataset, loader_options);
  }
  DataLoader& loader = *loader_ptr;
  // Validation data (dataset_val): every batch, in order, each time validation runs.
  std::unique_ptr<Dataset> val_dataset;
  std::unique_ptr<PreferenceDataset> val_pairs;
  std::unique_ptr<DataLoader> val_loader;
  if (cfg.has("dataset_val")) {
    LoaderOptions vo = loader_options;
    vo.num_shards = 1;  // validate() deals the batches out to the ranks
    vo.shard = 0;
    vo.shuffle = false;
    vo.drop_last = false;
    vo.batch_size = cfg.i64("batch_size_val", loader_options.batch_size);
    if (job.preference_data) {
      val_pairs =
          build_preference_dataset_from_config(cfg, *tokenizer, model.config, "dataset_val");
      val_loader = std::make_unique<DataLoader>(*val_pairs, vo);
    } else {
      val_dataset = build_dataset_from_config(cfg, *tokenizer, model.config, "dataset_val");
      val_loader = std::make_unique<DataLoader>(*val_dataset, vo);
    }
  }
  const std::optional<int64_t> val_every = cfg.opt_i64("run_val_every_n_steps");
  const DatasetReport& data_report = pairs ? pairs->report() : dataset->report();
  int64_t steps_per_epoch = loader.steps_per_epoch() / grad_accum;
  if (auto cap = cfg.opt_i64("max_steps_per_epoch"))
    steps_per_epoch = std::min(steps_per_epoch, *cap);
  FT_CHECK(steps_per_epoch >= 1,
           "the dataset yields " + std::to_string(loader.steps_per_epoch()) +
               " batches per epoch, fewer than gradient_accumulation_steps (" +
               std::to_string(grad_accum) + "): nothing to train on");
  const int64_t total_steps = steps_per_epoch * epochs;

  // ---- optimizer, schedule, resume ----------------------------------------------------------
  std::vector<std::string> trainable;
  for (const auto& [name, t] : model.params)
    if (job.trainable(name)) trainable.push_back(name);
  std::sort(trainable.begin(), trainable.end());
  std::vector<int64_t> trainable_numels;
  for (const std::string& name : trainable)
    trainable_numels.push_back(model.params.at(name).numel());
  std::unique_ptr<Optimizer> optimizer = build_optimizer(cfg);
  // zero_stage 1, 2, 3 (distributed recipes): each rank keeps the optimizer state of its share;
  // 2: and only its share of the summed gradients; 3: and only its share of the parameters.
  const int64_t zero_stage = job.comm ? cfg.i64("zero_stage", 0) : 0;
  FT_CHECK(zero_stage < 2 || !in_bwd, "optimizer_in_bwd: true cannot be combined with zero_stage " +
                                          std::to_string(zero_stage));
  dist::ShardedOptimizer* sharded = nullptr;
  if (zero_stage >= 1) {
    auto s = std::make_unique<dist::ShardedOptimizer>(std::move(optimizer), *job.comm, trainable,
                                                      trainable_numels, zero_stage < 3);
    sharded = s.get();
    optimizer = std::move(s);
  }
  const LRSchedule schedule = build_lr_schedule(cfg, total_steps);
  TrainingProgress progress;
  progress.seed = uint64_t(cfg.i64("seed", 0));
  TensorMap grads;  // gradient accumulation buffers (only with gradient_accumulation_steps > 1)
  auto param_refs = [&]() {
    std::vector<ParamRef> refs;
    for (const auto& name : trainable) refs.push_back({name, &model.params.at(name), &grads[name]});
    return refs;
  };
  std::string resumed_from;
  std::vector<std::string> skipped_checkpoints;  // damaged ones a resume passed over
  if (cfg.boolean("resume_from_checkpoint", false)) {
    std::vector<std::string> damaged;
    auto dir = latest_resumable_checkpoint(output_dir, &damaged);
    FT_CHECK(dir, "resume_from_checkpoint is true but " + output_dir.string() +
                      " holds no resumable checkpoint" +
                      (damaged.empty() ? "" : " (damaged: " + join(damaged, "; ") + ")"));
    for (const std::string& d : damaged) skipped_checkpoints.push_back(d);
    ResumedState r = job.load ? job.load(*dir, dtype) : load_training_checkpoint(*dir, dtype);
    // Another seed would shuffle the data differently: the run would silently not be the one
    // it claims to continue.
    FT_CHECK(r.progress.seed == progress.seed,
             "cannot resume from " + dir->string() + ": it was trained with seed " +
                 std::to_string(r.progress.seed) + " but the config says seed " +
                 std::to_string(progress.seed));
    for (auto& [name, t] : r.params) {
      auto it = model.params.find(name);
      FT_CHECK(it != model.params.end(),
               "checkpoint " + dir->string() + " has an unknown parameter '" + name + "'");
      // The loaders return the run's dtype (job.load's argument): anything else is a loader's
      // bug, named here rather than by the step graph.
      FT_CHECK(t.shape() == it->second.shape() && t.dtype() == it->second.dtype(),
               "cannot resume from " + dir->string() + ": parameter '" + name + "' loaded as " +
                   dtype_name(t.dtype()) + " " + shape_str(t.shape()) + " but the run's is " +
                   dtype_name(it->second.dtype()) + " " + shape_str(it->second.shape()));
      it->second = t;
    }
    optimizer->load_state(r.optimizer, param_refs());
    progress = r.progress;
    resumed_from = dir->string();
  }

  // ---- logging ------------------------------------------------------------------------------
  StepLoggerOptions lo;
  if (rank == 0) lo.output_dir = output_dir;  // other ranks: no files, nothing printed
  lo.print = rank == 0;
  if (rank != 0) lo.progress = ProgressBar::Mode::Never;
  // stdout: the step lines (and, as for every logger, the files under output_dir/logs);
  // disk, jsonl, tensorboard: the files in metric_logger.log_dir; tensorboard: event files too.
  const std::string logger_kind = canonical_component(cfg, "metric_logger");
  if (logger_kind != "stdout" && cfg.has("metric_logger.log_dir"))
    lo.log_dir = cfg.str("metric_logger.log_dir");
  lo.tensorboard = logger_kind == "tensorboard";
  lo.total_steps = total_steps;
  StepLogger logger(lo);
  RunHeader header;
  header.recipe = job.recipe;
  header.model = model.config.model_type + " (" + model.description + ")";
  const peft::ParameterCount counted = peft::count_parameters(model.params, job.trainable);
  header.params_total =
      counted.total + (job.params_stored_elsewhere ? job.params_stored_elsewhere() : 0);
  header.params_trainable = counted.trainable;
  header.threads = threads;
  header.dtype = cfg.str("dtype", "fp32");
  if (plan_dtype(cfg) == DType::BF16)
    header.extra.push_back({"bf16_matmul", kernels::bf16_matmul_description()});
  header.compile_mode = compile_mode_name(passes.mode);
  header.extra.push_back({"dataset", data_report.summary()});
  if (world > 1)
    header.extra.push_back({"ranks", std::to_string(world) + " (data parallel; global batch " +
                                         std::to_string(loader_options.batch_size * world) + ")"});
  header.extra.push_back({"steps", std::to_string(total_steps) + " (" +
                                       std::to_string(steps_per_epoch) + " per epoch)"});
  const double peak_gflops = kernels::measure_peak_gemm_gflops(512);
  header.extra.push_back({"peak_gemm_gflops", std::to_string(int64_t(peak_gflops))});
  if (!planned_peak.empty()) header.extra.push_back({"planned_peak", planned_peak});
  if (!resumed_from.empty()) header.extra.push_back({"resumed_from", resumed_from});
  for (const std::string& d : skipped_checkpoints)
    header.extra.push_back({"skipped_damaged_checkpoint", d});
  logger.header(header);
  for (const std::string& w : optimizer_warnings(cfg)) logger.message(w);
  for (const std::string& w : cpu_notes(cfg)) logger.message(w);
  if (cfg.boolean("low_cpu_ram", false))
    logger.message(
        "low_cpu_ram: true changes nothing here: the weights are read through mmap by one "
        "process, with no per-rank state-dict copies to avoid (note: a merged QLoRA save still "
        "dequantizes the whole base to fp32 in RAM)");

  // `at` is where a run resumed from this checkpoint continues.
  // ZeRO-3: each rank keeps only its share of the parameters (freed below, before training).
  std::unique_ptr<dist::ShardedParams> zero3;
  if (zero_stage == 3)
    zero3 = std::make_unique<dist::ShardedParams>(*job.comm, model.params, trainable,
                                                  job.shard_stored_elsewhere
                                                      ? job.shard_stored_elsewhere()
                                                      : std::map<std::string, Tensor*>{});
  auto save = [&](const std::string& name, const TrainingProgress& at) {
    if (sharded) sharded->gather_state("gathering the optimizer state for checkpoint " + name);
    if (zero3)
      zero3->gather_to_rank0("gathering the parameters for checkpoint " + name, job.save_reads);
    if (rank != 0) {
      if (job.comm) job.comm->barrier("waiting for rank 0 to write checkpoint " + name);
      return;
    }
    CheckpointContent c;
    c.config = &model.config;
    c.params = &model.params;
    c.optimizer = optimizer.get();
    c.progress = at;
    c.save_dtype = cfg.has("checkpointer.save_dtype")
                       ? parse_dtype(cfg.str("checkpointer.save_dtype"))
                       : dtype;  // default: the training dtype
    c.max_shard_bytes = cfg.bytes("checkpointer.max_shard_size", int64_t(5) << 30);
    c.copy_files_from = model.checkpoint_dir;
    if (job.save)
      job.save(output_dir / name, c);
    else
      save_training_checkpoint(output_dir / name, c);
    if (sharded) sharded->drop_gathered_state();
    if (zero3) zero3->release_others();
    logger.message("Saved checkpoint to " + (output_dir / name).string());
    if (keep_last_n)
      for (const auto& gone : prune_checkpoints(output_dir, output_dir / name, *keep_last_n))
        logger.message("Removed checkpoint " + gone.string() +
                       " (keep_last_n_checkpoints: " + std::to_string(*keep_last_n) + ")");
    if (job.comm) job.comm->barrier("writing checkpoint " + name);
  };

  // ---- the step ------------------------------------------------------------------------------
  StepContext ctx{
      cfg,         model,          {},
      pairs.get(), loader_options, [&logger](const std::string& line) { logger.message(line); },
      job.comm};
  ctx.step.model = &model.config;
  ctx.step.params = &model.params;
  ctx.step.trainable = job.trainable;
  ctx.step.llama = job.llama;
  ctx.step.eval_llama = job.eval_llama;
  ctx.step.passes = passes;
  if (zero3) {
    ctx.step.param_source = zero3->source();
    ctx.step.passes.params_at_use = true;
    ctx.step.passes.reshard_after_forward = cfg.boolean("fsdp_reshard_after_forward", true);
  }
  ctx.step.dtype = dtype;
  ctx.step.add_inputs = job.add_inputs;
  std::unique_ptr<TrainingStep> step = job.make_step ? job.make_step(ctx) : make_sft_step(ctx.step);
  // TEST-ONLY (test_only_faults.h): a +inf gradient at a chosen step, for the guard's test;
  // before the guard stops the run, the weights and state as they are go to a checkpoint.
  const std::optional<int64_t> test_only_inf_at = test_only::inf_gradient_step();
  if (test_only_inf_at)
    step = test_only::with_inf_gradient(std::move(step), *test_only_inf_at, rank == world - 1);
  auto test_only_save_at_stop = [&]() {
    if (test_only_inf_at) save(test_only::kStoppedCheckpoint, progress);
  };
  double lr = 0;  // the step's learning rate (optimizer_in_bwd updates inside step->run)
  // Adds a micro-batch's gradient into the step's accumulation buffer.
  auto accumulate = [&grads](const std::string& name, Tensor g, bool first) {
    Tensor& acc = grads[name];
    if (first) {
      acc = std::move(g);
    } else if (acc.dtype() == DType::BF16) {
      // bf16 gradients: each sum in fp32, rounded to nearest back to bf16 once per
      // micro-batch (at most half an ulp per micro-batch; no fp32 copy is held).
      uint16_t* a = acc.data<uint16_t>();
      const uint16_t* d = g.data<uint16_t>();
      for (int64_t i = 0; i < acc.numel(); ++i)
        a[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(d[i]));
    } else {
      float* a = acc.data<float>();
      const float* d = g.data<float>();
      for (int64_t i = 0; i < acc.numel(); ++i) a[i] += d[i];
    }
  };
  std::unique_ptr<dist::OwnedGradients> zero2;
  if (zero_stage >= 2)
    zero2 = std::make_unique<dist::OwnedGradients>(*job.comm, trainable, trainable_numels);
  if (in_bwd) {
    const bool ok = step->stream_gradients(
        [&, trainable_set = std::set<std::string>(trainable.begin(), trainable.end())](
            const std::string& name, Tensor grad) {
          if (!trainable_set.count(name)) return;
          ParamRef ref{name, &model.params.at(name), &grad};
          // A non-finite gradient is never applied (the parameters updated before it in this
          // step already are: the run stops and resumes from the last checkpoint).
          const double norm = fusetune::grad_norm({ref});
          if (!std::isfinite(norm)) {
            test_only_save_at_stop();
            const auto last = latest_resumable_checkpoint(output_dir);
            throw Error("step " + std::to_string(progress.global_step + 1) + ": the gradient of '" +
                        name + "' is not finite (norm " + std::to_string(norm) +
                        "); with optimizer_in_bwd the parameters updated before it in this step "
                        "already changed, so the run stops (diverged: lower optimizer.lr). Last "
                        "complete checkpoint: " +
                        (last ? last->string() + " (resume_from_checkpoint: true continues from it)"
                              : std::string("none yet")));
          }
          optimizer->step({ref}, lr);
        });
    FT_CHECK(ok, "optimizer_in_bwd: true is not supported by the " + job.recipe +
                     " recipe (its step cannot hand over gradients during the backward)");
    logger.message(
        "optimizer_in_bwd: each parameter is updated as soon as its gradient is computed and "
        "the gradient freed; grad_norm is not logged (no step sees all the gradients)");
  }

  // overlap_grad_allreduce (ZeRO-0/1, more than one rank, a step that hands over its gradients
  // during the backward): the first step records the order the backward produces the gradients
  // in and sums them after the backward; from the second on, the last micro-batch's gradients
  // are summed in buckets while its backward goes on (distributed/grad_stream.h). The other
  // micro-batches' gradients are held to the end of their run and accumulated as before.
  std::unique_ptr<dist::GradientStreamer> streamer;
  std::vector<std::string> arrival;  // the first backward's trainable gradients, in order
  std::vector<std::pair<std::string, Tensor>> held;
  bool can_stream = false, stream_now = false;
  int64_t micro_k = 0;
  const std::set<std::string> trainable_set(trainable.begin(), trainable.end());
  if (world > 1 && zero_stage < 2 && !in_bwd && cfg.boolean("overlap_grad_allreduce", true)) {
    if (!job.comm->serialized_threads()) {
      logger.message(
          "overlap_grad_allreduce: the MPI library does not provide MPI_THREAD_MULTIPLE: "
          "gradients are summed after the backward");
    } else {
      can_stream = step->stream_gradients([&](const std::string& name, Tensor g) {
        if (!stream_now) {
          if (!streamer && micro_k == 0 && trainable_set.count(name)) arrival.push_back(name);
          held.emplace_back(name, std::move(g));
          return;
        }
        accumulate(name, std::move(g), micro_k == 0);
        if (trainable_set.count(name)) streamer->add(name, grads.at(name));
      });
      if (!can_stream && cfg.has("overlap_grad_allreduce"))
        logger.message("overlap_grad_allreduce: the " + job.recipe +
                       " recipe's step sums its gradients after the backward");
    }
  }
  // ZeRO-2, 3 with a step that hands its gradients over during the backward: each one is
  // reduced into its owner right then (distributed/owned_gradients.h), so no rank holds the
  // gradients other ranks own, in the backward either.
  bool zero2_streams = false;
  std::string reduce_what;  // the step, for a timeout message
  if (zero2 && world > 1)
    zero2_streams = step->stream_gradients([&](const std::string& name, Tensor g) {
      zero2->hand_over(
          name, std::move(g),
          [&](const std::string& owned, Tensor sum) {
            accumulate(owned, std::move(sum), micro_k == 0);
          },
          reduce_what);
    });
  // Rank 0's list of trainable parameter names, on every rank (`what` names the broadcast).
  auto rank0_order = [&](const std::vector<std::string>& mine, const std::string& what) {
    std::map<std::string, int32_t> position;
    for (size_t i = 0; i < trainable.size(); ++i) position[trainable[i]] = int32_t(i);
    std::vector<int32_t> order;
    for (const std::string& name : mine)
      if (auto it = position.find(name); it != position.end()) order.push_back(it->second);
    int64_t n = int64_t(order.size());
    job.comm->broadcast(&n, sizeof n, 0, what);
    order.resize(size_t(n));
    job.comm->broadcast(order.data(), n * int64_t(sizeof(int32_t)), 0, what);
    std::vector<std::string> names;
    for (int32_t i : order) {
      FT_CHECK(i >= 0 && size_t(i) < trainable.size(), what + ": a bad parameter index");
      names.push_back(trainable[size_t(i)]);
    }
    return names;
  };
  // The first step's arrival order on rank 0 becomes every rank's bucket layout.
  auto start_streaming = [&](size_t summed) {
    FT_CHECK(arrival.size() == summed, "overlap_grad_allreduce: the backward handed over " +
                                           std::to_string(arrival.size()) + " of " +
                                           std::to_string(summed) + " gradients");
    std::vector<std::string> names = rank0_order(arrival, "the gradient bucket layout broadcast");
    std::vector<int64_t> numels;
    std::vector<DType> dtypes;
    for (const std::string& name : names) {
      FT_CHECK(grads.count(name),
               "overlap_grad_allreduce: rank 0's gradients differ from "
               "this rank's ('" +
                   name + "')");
      const Tensor& g = grads.at(name);
      numels.push_back(g.numel());
      dtypes.push_back(g.dtype());
    }
    streamer = std::make_unique<dist::GradientStreamer>(*job.comm, names, numels, dtypes);
    logger.message("overlap_grad_allreduce: from step 2 the gradients are summed in " +
                   std::to_string(streamer->jobs()) +
                   " collectives while the last micro-batch's backward runs");
  };

  // Mean loss over the validation data per loss unit (torchtune's val_loss), logged on its
  // own line and in metrics.jsonl. Ranks: validation batch k is rank k % world's (each sample
  // once, batched as in one process), and the loss sums and units are all-reduced, so the value
  // is the global one.
  auto validate = [&]() {
    const int64_t batches = val_loader->steps_per_epoch();
    double sums[2] = {0, 0};  // loss, loss units
    for (int64_t k = rank; k - rank < batches; k += world) {
      // ZeRO-3 gathers the parameters collectively in every forward: a rank short of batches
      // evaluates its first one again and drops the result, so all run as many forwards.
      const bool extra = k >= batches;
      if (extra && !zero3) break;
      val_loader->set_state({0, extra ? rank % batches : k});
      const Batch b = val_loader->next();
      const double loss = step->evaluate(b);
      if (extra) continue;
      sums[0] += loss;
      sums[1] += double(step->loss_units(b));
    }
    if (job.comm && world > 1)
      job.comm->allreduce_sum(
          sums, 2,
          "the validation loss all-reduce at step " + std::to_string(progress.global_step));
    const double val_loss = sums[1] > 0 ? sums[0] / sums[1] : std::nan("");
    logger.log_values(progress.global_step, {{"val_loss", val_loss}});
  };

  // ---- train --------------------------------------------------------------------------------
  if (zero3) zero3->release_others();
  for (; progress.epoch < epochs; ++progress.epoch, progress.step_in_epoch = 0) {
    if (progress.step_in_epoch == 0)
      loader.set_state({progress.epoch, 0});
    else
      loader.set_state(progress.loader);
    for (; progress.step_in_epoch < steps_per_epoch; ++progress.step_in_epoch) {
      memory::reset_peak();
      const auto t0 = Clock::now();
      // The loss is normalized by the loss units (tokens, pairs) of the whole optimizer step.
      std::vector<Batch> micro;
      int64_t units = 0;
      const std::string at_step = " of step " + std::to_string(progress.global_step + 1);
      for (int64_t k = 0; k < grad_accum; ++k) {
        micro.push_back(loader.next());
        units += step->loss_units(micro.back());
      }
      // Ranks: normalized by the whole step's units over all ranks (not per rank).
      if (job.comm) job.comm->allreduce_sum(&units, 1, "the loss-unit all-reduce" + at_step);
      const double scale = units > 0 ? 1.0 / double(units) : 0.0;
      lr = schedule.lr_at(progress.global_step);
      reduce_what = "the gradient reduce (ZeRO-2)" + at_step;
      if (zero2_streams && !zero2->has_order())
        zero2->set_order(
            rank0_order(rank == 0 ? step->gradient_order(micro[0]) : std::vector<std::string>{},
                        "the gradient order broadcast (ZeRO-2)"));
      double loss = 0;
      std::vector<StepMetric> metrics;
      const bool streaming = streamer != nullptr;
      for (size_t k = 0; k < micro.size(); ++k) {
        micro_k = int64_t(k);
        stream_now = streaming && k + 1 == micro.size();
        if (stream_now) streamer->begin("the gradient all-reduce" + at_step);
        StepOutputs out = step->run(micro[k], scale, progress.global_step, int64_t(k));
        if (zero2_streams) zero2->end_of_backward();
        if (!held.empty()) {  // handed over during the run: accumulated here as before
          std::sort(held.begin(), held.end(),
                    [](const auto& a, const auto& b) { return a.first < b.first; });
          for (auto& h : held) out.grads.push_back(std::move(h));
          held.clear();
        }
        loss += out.loss;
        for (auto& [name, g] : out.grads) {
          // ZeRO-2, 3 (a step that cannot stream): each micro-batch's gradients summed into their
          // owners (in name order, the same on every rank); the others are dropped, so only the
          // owned ones accumulate.
          if (zero2 && !zero2->reduce(name, g, "the gradient reduce (ZeRO-2)" + at_step)) continue;
          accumulate(name, std::move(g), k == 0);
        }
        // Metric sums and counts add up over the micro-batches.
        if (k == 0) metrics.assign(out.metrics.size(), {});
        for (size_t i = 0; i < out.metrics.size(); ++i) {
          metrics[i].name = out.metrics[i].name;
          metrics[i].sum += out.metrics[i].sum;
          metrics[i].count += out.metrics[i].count;
        }
      }
      stream_now = false;
      // The buckets' collectives come first on every rank (only that thread calls MPI until
      // then).
      if (streaming) streamer->finish();
      if (job.comm && world > 1) {
        // Ranks: the step's loss, metric sums and counts, and gradients summed over the ranks;
        // clipping and the update then see the global gradient (docs/design.md §7: accumulate ->
        // reduce -> clip).
        std::vector<double> scalars = {loss};
        for (const StepMetric& mv : metrics) {
          scalars.push_back(mv.sum);
          scalars.push_back(mv.count);
        }
        job.comm->allreduce_sum(scalars.data(), int64_t(scalars.size()),
                                "the loss all-reduce" + at_step);
        loss = scalars[0];
        for (size_t i = 0; i < metrics.size(); ++i) {
          metrics[i].sum = scalars[1 + 2 * i];
          metrics[i].count = scalars[2 + 2 * i];
        }
        std::vector<Tensor*> reduce;
        for (const std::string& name : trainable)  // sorted: the same order on every rank
          if (auto it = grads.find(name); it != grads.end()) reduce.push_back(&it->second);
        if (!zero2 && !streaming) {
          dist::allreduce_gradients(*job.comm, reduce, "the gradient all-reduce" + at_step);
          if (can_stream) start_streaming(reduce.size());
        }
      }
      const double compile_s = step->take_compile_seconds();
      std::optional<double> grad_norm;
      if (in_bwd) {
        // The parameters are already updated (their gradients were finite).
        if (!std::isfinite(loss)) {
          test_only_save_at_stop();
          std::string msg =
              non_finite_step_message(progress.global_step + 1, loss, 0, micro, output_dir);
          const std::string not_applied = "the update was not applied";
          const size_t at = msg.find(not_applied);
          if (at != std::string::npos)
            msg.replace(at, not_applied.size(),
                        "the update was already applied (optimizer_in_bwd)");
          throw Error(msg);
        }
      } else {
        std::vector<ParamRef> refs = param_refs();
        // A non-finite loss or gradient is never applied to the weights (clip_grad_norm leaves
        // non-finite gradients untouched and returns their norm).
        double norm = 0;
        if (zero2) {  // each rank holds its share of the gradients
          norm = zero2->global_norm(refs, "the gradient norm all-reduce" + at_step);
          if (clip) clip_to_norm(refs, *clip, norm);
        } else {
          norm = clip ? clip_grad_norm(refs, *clip) : fusetune::grad_norm(refs);
        }
        if (!std::isfinite(loss) || !std::isfinite(norm)) {
          test_only_save_at_stop();
          throw Error(
              non_finite_step_message(progress.global_step + 1, loss, norm, micro, output_dir));
        }
        if (clip) grad_norm = norm;
        optimizer->step(refs, lr);
        grads.clear();
      }
      ++progress.global_step;

      const double step_s = seconds_since(t0);
      const double comm_s = job.comm ? job.comm->take_comm_seconds() : 0.0;
      const int64_t new_gather_buffers = zero3 ? zero3->take_new_gather_buffers() : 0;
      // overlap_grad_allreduce: the step's own collectives and its waits for the buckets'.
      const double comm_wait_s =
          streaming ? comm_s - streamer->take_collective_seconds() + streamer->take_wait_seconds()
                    : 0.0;
      if (progress.global_step % log_every == 0 || progress.global_step == 1) {
        int64_t tokens = 0;
        for (const Batch& b : micro) tokens += b.num_valid_labels();  // this rank's
        StepMetrics m;
        m.step = progress.global_step;
        m.epoch = progress.epoch + 1;
        m.loss = loss;
        m.lr = lr;
        m.tokens_per_second_per_gpu = double(tokens) / step_s;
        if (log_memory) m.peak_memory_alloc_bytes = memory::peak_bytes();
        m.grad_norm = grad_norm;
        double flops = 0;
        for (const Batch& b : micro) flops += step->flops(b);
        for (const StepMetric& mv : metrics)
          m.extra.push_back({mv.name, mv.count > 0 ? mv.sum / mv.count : 0.0, 4});
        m.extra.push_back({"mfu", flops / step_s / (peak_gflops * 1e9), 3});
        if (compile_s > 0) m.extra.push_back({"compile_s", compile_s, 3});
        // Ranks: rank 0's time in collectives this step, waiting for the others included.
        if (world > 1) m.extra.push_back({"comm_s", comm_s, 3});
        // ZeRO-3: rank 0's gather buffers allocated this step (0 once its pool is warm).
        if (zero3 && world > 1)
          m.extra.push_back({"gather_new_buffers", double(new_gather_buffers), 0});
        // overlap_grad_allreduce: what of it the step waited for (the rest ran during the
        // backward).
        if (streaming) m.extra.push_back({"comm_wait_s", comm_wait_s, 3});
        logger.log(m);
      }
      logger.progress(progress.epoch + 1, progress.global_step, loss);
      if (val_loader && val_every && progress.global_step % *val_every == 0) validate();
      if (save_every && progress.global_step % *save_every == 0 &&
          progress.step_in_epoch + 1 < steps_per_epoch) {
        TrainingProgress at = progress;
        at.step_in_epoch += 1;
        at.loader = loader.state();
        save("step_" + std::to_string(progress.global_step), at);
      }
    }
    if (val_loader && !val_every) validate();  // no cadence given: at the end of each epoch
    TrainingProgress at = progress;
    at.epoch += 1;
    at.step_in_epoch = 0;
    at.loader = {at.epoch, 0};
    save("epoch_" + std::to_string(progress.epoch), at);
  }
  logger.close();
  return 0;
}

}  // namespace fusetune
