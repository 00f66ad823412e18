#pragma once
// The training loop's settings, parsed once from a recipe's config into types (docs/design.md
// §7). Every default comes from the recipe's schema: the config is read through
// with_defaults(), so a config with or without the schema's defaults applied gives the same
// settings, and no key has a second default at its read site.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "fusetune/compile/compiler.h"
#include "fusetune/config/config.h"
#include "fusetune/config/schema.h"
#include "fusetune/core/dtype.h"

namespace fusetune {

struct TrainSettings {
  std::filesystem::path output_dir;
  DType dtype = DType::F32;
  std::string dtype_text;  // as the config spells it (fp32, bf16), for the run header
  CompileMode compile = CompileMode::None;
  bool activation_checkpointing = false;
  int64_t epochs = 1;
  int64_t grad_accum = 1;  // gradient_accumulation_steps
  int64_t log_every = 1;   // log_every_n_steps
  bool log_peak_memory = true;
  std::optional<double> clip_grad_norm;
  std::optional<int64_t> save_every;  // save_every_n_steps
  std::optional<int64_t> keep_last_n;
  std::optional<int64_t> max_steps_per_epoch;
  std::optional<int64_t> num_steps;  // the GRPO recipes' (torchtune's): a cap on all the steps
  bool optimizer_in_bwd = false;
  uint64_t seed = 0;
  bool resume = false;  // resume_from_checkpoint
  bool low_cpu_ram = false;
  std::string metric_logger;  // the canonical component name
  std::optional<std::string> metric_log_dir;
  std::optional<DType> save_dtype;        // checkpointer.save_dtype; none: the training dtype
  int64_t max_shard_bytes = 0;            // checkpointer.max_shard_size
  bool has_validation = false;            // dataset_val
  std::optional<int64_t> val_every;       // run_val_every_n_steps
  std::optional<int64_t> batch_size_val;  // none: batch_size
  // The distributed recipes' keys; a recipe whose schema lacks them runs as one process.
  int64_t zero_stage = 0;
  bool reshard_after_forward = true;           // fsdp_reshard_after_forward
  std::optional<bool> overlap_grad_allreduce;  // none: the recipe has no such key
  int64_t bucket_elements = 0;                 // bucket_cap_mb in fp32 elements; 0: no such key

  bool operator==(const TrainSettings&) const = default;
};

// Reads and checks the settings of `cfg` (validated against `schema`); an Error names what is
// out of range or cannot be combined.
TrainSettings parse_train_settings(const Config& cfg, const Schema& schema);

// The run's seed (`seed`, default in the training schema), for setup code handed a Config.
uint64_t config_seed(const Config& cfg);

}  // namespace fusetune
