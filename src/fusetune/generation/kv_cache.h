#pragma once
// The KV cache of a generation session: each layer's keys and values [B, S, KV, hd] in the
// model's compute dtype (fp32 for a bf16 model: the cache is written in place, and 8-bit
// mantissas would put 0.4% errors into every attention score), zero-filled at the start. Every prefill and decode run binds them to the
// step graph's "kv_cache.*" inputs (models/decode_graph.h), and Op::KVCacheAttention writes the
// new tokens' keys and values into them, so they carry the state from one run to the next.
#include <cstdint>

#include "fusetune/models/model_config.h"
#include "fusetune/runtime/executor.h"

namespace fusetune {

class KVCache {
 public:
  KVCache(const ModelConfig& cfg, int64_t batch, int64_t length, DType dtype);
  int64_t batch() const { return batch_; }
  int64_t length() const { return length_; }
  int64_t bytes() const { return bytes_; }
  // Adds the cache tensors to a run's inputs (shared storage: the run writes into them).
  void bind(TensorMap& inputs) const;

  // Bytes of a cache of this size (for plans and reports).
  static int64_t bytes_for(const ModelConfig& cfg, int64_t batch, int64_t length, DType dtype);

 private:
  TensorMap tensors_;
  int64_t batch_, length_, bytes_;
};

}  // namespace fusetune
