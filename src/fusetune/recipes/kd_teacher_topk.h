#pragma once
// Precomputed teacher logits for knowledge distillation (docs/distillation.md), for teachers
// too large to run every step: the teacher runs once over the training samples, each sample's
// top-k token ids and log-probs (at every position) go to one file, and training reads them
// instead of running the teacher. The file (safetensors: tensors offsets, ids, logprobs) has
// in its header's metadata the dataset, tokenizer and teacher it was computed for
// (fingerprints), checked on load, and a CRC-32C of its tensors, which catches corruption.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "fusetune/config/config.h"
#include "fusetune/core/tensor.h"
#include "fusetune/data/batch.h"
#include "fusetune/data/collate.h"
#include "fusetune/data/dataset.h"
#include "fusetune/io/safetensors.h"

namespace fusetune {

// The config's `teacher_logits` section.
struct TeacherLogitsOptions {
  int64_t top_k = 0;        // the teacher's distribution restricted to its top-k tokens
  bool precompute = false;  // from the file at `path` (computed there when missing)
  std::filesystem::path path;
  std::filesystem::path file() const { return path / "teacher_topk.safetensors"; }
  // The validation samples' (dataset_val), keyed by that dataset's fingerprint.
  std::filesystem::path val_file() const { return path / "teacher_topk_val.safetensors"; }
};
// Empty when the config has no teacher_logits; throws naming the key when top_k is not in
// [1, vocab_size], precompute has no path, or kd_loss is not the forward KL (the one
// divergence defined on the top-k support).
std::optional<TeacherLogitsOptions> teacher_logits_options(const Config& cfg, int64_t vocab_size);

// What a file was computed for.
struct TeacherTopKKey {
  int64_t top_k = 0, vocab_size = 0, samples = 0;
  uint64_t dataset = 0, tokenizer = 0, teacher = 0;
};
// Fingerprints (64-bit FNV-1a): every sample's tokens and labels; the tokenizer section and
// the bytes of the file it names; the teacher's sections, its config.json and checkpoint
// files' names, sizes and first MiB (its weights are not read).
uint64_t dataset_fingerprint(const Dataset& d);
uint64_t tokenizer_fingerprint(const Config& cfg);
uint64_t teacher_fingerprint(const Config& teacher_cfg);

// A loaded file (a safetensors file, mmap'd: its pages are read as batches touch them): per
// sample, one row of top_k ids and log-probs per token.
class TeacherTopK {
 public:
  // Reads `file` and checks it against `want`; throws naming the file and what differs (or
  // that it is truncated or corrupt).
  static TeacherTopK load(const std::filesystem::path& file, const TeacherTopKKey& want);
  int64_t top_k() const { return key_.top_k; }
  // ids [B*T, K] I32 and log-probs [B*T, K] F32 for b's rows (b.items: their samples): a
  // sample's rows where its tokens are, id 0 at kTopKFloorLogit on padding (ignored).
  void batch_inputs(const Batch& b, Tensor& ids, Tensor& logprobs) const;

 private:
  TeacherTopKKey key_;
  std::shared_ptr<SafetensorsFile> file_;
  Tensor offsets_;   // I64 [samples + 1]: sample i's rows are [offsets_[i], offsets_[i + 1])
  Tensor ids_;       // I32 [rows, K], over the file's bytes
  Tensor logprobs_;  // F32 [rows, K]
};

// Computes every sample's top-k in dataset order, `rows` samples per batch (top_k_of: the
// batch's ids and log-probs [B*T, K]), and writes the file atomically.
using TopKOfBatch = std::function<void(const Batch& b, Tensor& ids, Tensor& logprobs)>;
void write_teacher_topk(const std::filesystem::path& file, const TeacherTopKKey& key,
                        const Dataset& d, const CollateOptions& collate, int64_t rows,
                        const TopKOfBatch& top_k_of);

// Over ranks (docs/distillation.md): the samples are cut into batches of `rows` as one process
// cuts them, and batch k is computed by shard k % shards, each writing its batches to its own
// part file (atomically). The shard owning the file then merges the parts in batch order into
// the one-process file: the same batches through the same kernels give the same bytes.
std::filesystem::path teacher_topk_part_file(const std::filesystem::path& file, int shard,
                                             int shards);
void write_teacher_topk_part(const std::filesystem::path& file, const TeacherTopKKey& key,
                             const Dataset& d, const CollateOptions& collate, int64_t rows,
                             int shard, int shards, const TopKOfBatch& top_k_of);
// Reads the `shards` part files (each must be there), checks each was computed for `key`,
// `rows` and `shards`, writes `file` and deletes the parts.
void merge_teacher_topk_parts(const std::filesystem::path& file, const TeacherTopKKey& key,
                              int64_t rows, int shards);

}  // namespace fusetune
