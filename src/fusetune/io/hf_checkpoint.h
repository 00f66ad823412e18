#pragma once
// Hugging Face checkpoint directories for the Llama family: config.json plus one
// model.safetensors or shards listed by model.safetensors.index.json. Loading checks every
// tensor against the names and shapes config.json implies; saving writes the same layout,
// published atomically (a crash never leaves a complete-looking partial directory).
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "fusetune/core/tensor.h"
#include "fusetune/io/safetensors.h"
#include "fusetune/models/model_config.h"
#include "fusetune/models/param_sink.h"

namespace fusetune {

// HF parameter names and shapes for `c`, in HF's module order.
std::vector<std::pair<std::string, Shape>> expected_parameters(const ModelConfig& c);

struct HFCheckpoint {
  ModelConfig config;
  // Tensors already in the target dtype borrow the mmap'd file (copy-on-write, not counted
  // by core/memory.h); converted ones are counted copies. Each keeps its file mapped.
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> source_file;  // tensor name -> file it came from
};

// Loads `dir`: config.json, then `checkpoint_files` (relative to dir) when given, else
// model.safetensors.index.json, else model.safetensors. Floating tensors are converted to
// `target` (a float type). Throws fusetune::Error on a missing, unexpected or misshapen tensor.
// A multimodal checkpoint (Gemma3ForConditionalGeneration: config.json's text_config, tensors
// under language_model.model. / language_model.lm_head, or model.language_model. / lm_head)
// loads as its text model, tensors by the text model's names ("model.layers.0...."); the
// vision tower's and projector's are not loaded (a note on stderr says so), and the config
// remembers `dir` so that a save writes them back.
HFCheckpoint load_hf_checkpoint(const std::filesystem::path& dir,
                                const std::vector<std::string>& checkpoint_files = {},
                                DType target = DType::F32);

// Loads `dir` like load_hf_checkpoint, but straight into owned, counted tensors of dtype
// `target`, one tensor at a time: each is converted from the mapped bytes into its final
// storage (no borrowed or intermediate copy), its pages are dropped once copied, and each
// shard is unmapped when its tensors are done. Peak memory: the final footprint plus the
// pages of one tensor. Tensors `sink` takes are handed to it as F32 (one temporary at a
// time) and are absent from `tensors`. For loading a model to train.
HFCheckpoint load_hf_checkpoint_owned(const std::filesystem::path& dir,
                                      const std::vector<std::string>& checkpoint_files = {},
                                      DType target = DType::F32, ParamSink* sink = nullptr);

struct SaveOptions {
  DType dtype = DType::F32;  // or BF16 / F16: floating tensors are converted on the way out
  int64_t max_shard_bytes = int64_t(5) << 30;
  // Copied when present there: tokenizer.json, tokenizer_config.json, special_tokens_map.json,
  // tokenizer.model, generation_config.json, and a multimodal model's
  // preprocessor_config.json, processor_config.json, chat_template.json.
  std::filesystem::path copy_files_from;
};

// The files copied by SaveOptions::copy_files_from.
const std::vector<std::string>& hf_side_files();

// Writes config.json + model.safetensors (or model-0000i-of-0000n.safetensors shards and
// model.safetensors.index.json) into `dir`, replacing an existing checkpoint there. Refuses
// to replace a non-empty directory that holds no config.json (it is not a checkpoint).
// A multimodal model's (ModelConfig::multimodal) is written in its source checkpoint's layout:
// the text tensors under the names they came with, then the source's other tensors byte for
// byte in their own dtype, and its config.json with text_config rewritten (keys it left out
// stay out where the defaults give the same model); without a source
// checkpoint (a model from a config.json file), the text model alone (Gemma3ForCausalLM).
void save_hf_checkpoint(const std::filesystem::path& dir, const ModelConfig& config,
                        const NamedTensors& tensors, const SaveOptions& options = {});
// The same with each tensor produced only when its shard is written (io/safetensors.h), so
// that at most one tensor of the model is in memory at a time.
void save_hf_checkpoint(const std::filesystem::path& dir, const ModelConfig& config,
                        const std::vector<TensorSource>& tensors, const SaveOptions& options = {});

}  // namespace fusetune
