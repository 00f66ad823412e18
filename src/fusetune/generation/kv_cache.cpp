#include "fusetune/generation/kv_cache.h"

#include <string>

namespace fusetune {

KVCache::KVCache(const ModelConfig& cfg, int64_t batch, int64_t length, DType dtype)
    : batch_(batch), length_(length), bytes_(bytes_for(cfg, batch, length, dtype)) {
  const Shape shape{batch, length, cfg.num_key_value_heads, cfg.head_dim};
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    tensors_["kv_cache.k." + std::to_string(l)] = Tensor::zeros(shape, dtype);
    tensors_["kv_cache.v." + std::to_string(l)] = Tensor::zeros(shape, dtype);
  }
}

void KVCache::bind(TensorMap& inputs) const {
  for (const auto& [name, t] : tensors_) inputs[name] = t;
}

int64_t KVCache::bytes_for(const ModelConfig& cfg, int64_t batch, int64_t length, DType dtype) {
  return 2 * cfg.num_hidden_layers * batch * length * cfg.num_key_value_heads * cfg.head_dim *
         int64_t(dtype_size(dtype));
}

}  // namespace fusetune
