#include "fusetune/recipes/train_settings.h"

#include <string>

#include "fusetune/config/recipe_schemas.h"
#include "fusetune/distributed/grad_allreduce.h"
#include "fusetune/recipes/recipe_setup.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

// Without a checkpointer section (a randomly initialized model) the schema has no
// checkpointer.max_shard_size to default, and checkpoints are sharded at 5 GiB.
constexpr int64_t kShardBytesWithoutCheckpointer = int64_t(5) << 30;

void check_settings(const TrainSettings& s) {
  FT_CHECK(!s.keep_last_n || *s.keep_last_n >= 1,
           "checkpointer.keep_last_n_checkpoints must be >= 1, got " +
               std::to_string(s.keep_last_n.value_or(0)));
  FT_CHECK(s.epochs >= 1 && s.grad_accum >= 1 && s.log_every >= 1,
           "epochs, gradient_accumulation_steps and log_every_n_steps must be >= 1");
  // optimizer_in_bwd: each parameter is updated as soon as the backward has computed its
  // gradient, which is then freed; all the gradients are never held at once.
  FT_CHECK(!s.optimizer_in_bwd || !s.clip_grad_norm,
           "clip_grad_norm cannot be combined with optimizer_in_bwd: true: clipping scales every "
           "gradient by the global gradient norm, which needs all the gradients before any "
           "parameter is updated, while optimizer_in_bwd updates each parameter as soon as its "
           "gradient is ready (torchtune refuses the combination too); remove clip_grad_norm "
           "or set optimizer_in_bwd: false");
  FT_CHECK(!s.optimizer_in_bwd || s.grad_accum == 1,
           "optimizer_in_bwd: true needs gradient_accumulation_steps: 1 (got " +
               std::to_string(s.grad_accum) +
               "): each parameter is updated as soon as its gradient is ready, so gradients "
               "cannot be summed over micro-batches first (as in torchtune)");
}

}  // namespace

TrainSettings parse_train_settings(const Config& cfg, const Schema& schema) {
  const Config c = with_defaults(cfg, schema);
  TrainSettings s;
  s.output_dir = c.str("output_dir");
  s.dtype_text = c.str("dtype");
  s.dtype = parse_dtype(s.dtype_text);
  s.compile = parse_compile_mode(c.str("compile"));
  s.activation_checkpointing = c.boolean("enable_activation_checkpointing");
  s.epochs = c.i64("epochs");
  s.grad_accum = c.i64("gradient_accumulation_steps");
  s.log_every = c.i64("log_every_n_steps");
  s.log_peak_memory = c.boolean("log_peak_memory_stats");
  s.clip_grad_norm = c.opt_f64("clip_grad_norm");
  s.save_every = c.opt_i64("save_every_n_steps");
  s.keep_last_n = c.opt_i64("checkpointer.keep_last_n_checkpoints");
  s.max_steps_per_epoch = c.opt_i64("max_steps_per_epoch");
  s.optimizer_in_bwd = c.boolean("optimizer_in_bwd");
  s.seed = uint64_t(c.i64("seed"));
  s.resume = c.boolean("resume_from_checkpoint");
  s.low_cpu_ram = c.boolean("low_cpu_ram");
  // stdout: the step lines (and, as for every logger, the files under output_dir/logs);
  // disk, jsonl, tensorboard: the files in metric_logger.log_dir.
  s.metric_logger = canonical_component(c, "metric_logger");
  if (s.metric_logger != "stdout" && c.has("metric_logger.log_dir"))
    s.metric_log_dir = c.str("metric_logger.log_dir");
  if (c.has("checkpointer.save_dtype"))
    s.save_dtype = parse_dtype(c.str("checkpointer.save_dtype"));
  s.max_shard_bytes = c.has("checkpointer") ? c.bytes("checkpointer.max_shard_size")
                                            : kShardBytesWithoutCheckpointer;
  s.has_validation = c.has("dataset_val");
  s.num_steps = c.opt_i64("num_steps");
  s.val_every = c.opt_i64("run_val_every_n_steps");
  s.batch_size_val = c.opt_i64("batch_size_val");
  if (c.has("zero_stage")) s.zero_stage = c.i64("zero_stage");
  if (c.has("fsdp_reshard_after_forward"))
    s.reshard_after_forward = c.boolean("fsdp_reshard_after_forward");
  if (c.has("overlap_grad_allreduce"))
    s.overlap_grad_allreduce = c.boolean("overlap_grad_allreduce");
  if (c.has("bucket_cap_mb"))
    s.bucket_elements = dist::bucket_elements_of_mib(c.f64("bucket_cap_mb"));
  check_settings(s);
  return s;
}

uint64_t config_seed(const Config& cfg) {
  if (cfg.has("seed")) return uint64_t(cfg.i64("seed"));
  static const uint64_t schema_default =
      uint64_t(std::stoll(full_finetune_schema().field("seed").default_yaml));
  return schema_default;
}

}  // namespace fusetune
