#pragma once
// The setup steps every training recipe shares, each reading one section of the config:
// threads, model (architecture + weights), tokenizer, dataset, optimizer, lr schedule.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "fusetune/compile/memory_estimate.h"
#include "fusetune/config/config.h"
#include "fusetune/data/dataset.h"
#include "fusetune/data/datasets/preference.h"
#include "fusetune/data/loader.h"
#include "fusetune/models/model_config.h"
#include "fusetune/models/param_sink.h"
#include "fusetune/optim/lr_schedule.h"
#include "fusetune/optim/optimizer.h"
#include "fusetune/optim/state_size.h"
#include "fusetune/runtime/executor.h"
#include "fusetune/tokenizers/tokenizer.h"

namespace fusetune {

// num_threads (or OMP_NUM_THREADS) applied to OpenMP and OpenBLAS; returns the count.
int configure_threads(const Config& cfg);

struct LoadedModel {
  ModelConfig config;
  TensorMap params;                      // counted, owned, in the run's dtype, by HF name
  std::filesystem::path checkpoint_dir;  // where the weights came from (empty: random init)
  std::string description;               // for the run header
};

// `model.init: random` builds the architecture from `model` (inline keys or `model.config`, a
// config.json) and initializes it from `seed`; otherwise the weights come from
// `checkpointer.checkpoint_dir`. The parameter set is the model graph's (so it always matches).
// Either way each parameter is produced straight into its final storage, one tensor at a
// time (peak memory: the final footprint plus one tensor): in `dtype`, or, for those `sink`
// takes (QLoRA's NF4 base), handed to the sink as F32 and left out of `params`.
LoadedModel load_model(const Config& cfg, DType dtype, ParamSink* sink = nullptr);

// The architecture alone (no weights read): for planning.
ModelConfig model_architecture(const Config& cfg);

// The sequence classifier the config asks for (docs/design.md §12): model.num_labels (or
// torchtune's num_classes), 1 for torchtune's *_reward_* builders and for
// checkpointer.model_type REWARD; 0 when it asks for none (the checkpoint decides).
int64_t requested_num_labels(const Config& cfg);

// Makes `m` a sequence classifier of `num_labels` scores when it is a causal LM, as transformers
// loads a *ForCausalLM checkpoint into a *ForSequenceClassification: lm_head dropped, `score`
// initialized fresh (normal, std `init_std`, from `seed`). A classifier with another number of
// labels is an error; one with as many is left as it is.
void to_sequence_classifier(LoadedModel& m, int64_t num_labels, uint64_t seed, double init_std);

// The training sequence length the config asks for (dataset.max_seq_len, else
// tokenizer.max_seq_len), or 0 when unbounded.
int64_t configured_max_seq_len(const Config& cfg);

// The optimizer state per trainable parameter (AdamW: 2 bytes per parameter byte, SGD with
// momentum 1, 8-bit AdamW its quantized state), for memory estimates.
OptimizerStateSize optimizer_state_ratio(const Config& cfg);

// Lines the run log should carry about the optimizer config (PagedAdamW8bit: no paging on a
// CPU).
std::vector<std::string> optimizer_warnings(const Config& cfg);

// `dtype`: fp32 (float32) or bf16 (bfloat16); anything else is an error naming the key.
DType parse_dtype(const std::string& s);

// `device: cuda` (every torchtune config says so): this build runs on the CPU, and says so
// once instead of refusing the config; likewise `enable_activation_offloading: true`.
std::vector<std::string> cpu_notes(const Config& cfg);

std::unique_ptr<Tokenizer> build_tokenizer(const Config& cfg);
// `section`: "dataset", or "dataset_val" for the validation data.
std::unique_ptr<Dataset> build_dataset_from_config(const Config& cfg, const Tokenizer& tok,
                                                   const ModelConfig& model,
                                                   const std::string& section = "dataset");
// The DPO recipes' data: preference pairs (data/datasets/preference.h).
std::unique_ptr<PreferenceDataset> build_preference_dataset_from_config(
    const Config& cfg, const Tokenizer& tok, const ModelConfig& model,
    const std::string& section = "dataset");
LoaderOptions loader_options_from(const Config& cfg, const Tokenizer& tok);
// The optimizer the config's `optimizer` section selects, built by the builder registered
// under its canonical component name (torchtune's instantiate).
std::unique_ptr<Optimizer> build_optimizer(const Config& cfg);
// Whether build_optimizer has a builder for this canonical optimizer component name.
bool has_optimizer_builder(const std::string& component);
LRSchedule build_lr_schedule(const Config& cfg, int64_t total_steps);

}  // namespace fusetune
