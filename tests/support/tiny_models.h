#pragma once
// Tiny model configurations and step inputs shared by model, compile and recipe tests.
#include <random>

#include "fusetune/data/batch.h"
#include "fusetune/models/model_config.h"
#include "fusetune/runtime/eager_executor.h"

namespace fusetune::testing {

inline ModelConfig tiny_config(bool tied, bool qkv_bias, int64_t kv_heads = 2) {
  ModelConfig c;
  c.vocab_size = 13;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = kv_heads;
  c.head_dim = 4;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000;
  c.tie_word_embeddings = tied;
  c.attention_bias = qkv_bias;
  c.max_position_embeddings = 64;
  return c;
}

// The same as a Qwen3: q/k norms before RoPE, head_dim 6 apart from hidden_size / heads (4),
// tied embeddings.
inline ModelConfig tiny_qwen3_config() {
  ModelConfig c = tiny_config(true, false);
  c.model_type = "qwen3";
  c.head_dim = 6;
  return c;
}

// The same as a Gemma: the tanh-GELU gate, RMSNorm by (1 + w), embeddings times
// sqrt(hidden_size), head_dim 6 apart from hidden_size / heads (4), one KV head (MQA), tied.
inline ModelConfig tiny_gemma_config() {
  ModelConfig c = tiny_config(true, false, 1);
  c.model_type = "gemma";
  c.hidden_act = "gelu_pytorch_tanh";
  c.head_dim = 6;
  return c;
}

// The same as a Gemma 2: Gemma's with norms after attention and the MLP too, the attention
// scores and the logits soft-capped (caps small enough to bite on random weights), the first of
// 3 layers local with a window of 3 (shorter than the tests' sequences), and the attention
// scaled by query_pre_attn_scalar 5 (not head_dim).
inline ModelConfig tiny_gemma2_config() {
  ModelConfig c = tiny_gemma_config();
  c.model_type = "gemma2";
  c.num_hidden_layers = 3;
  c.attn_logit_softcapping = 0.8;
  c.final_logit_softcapping = 1.5;
  c.query_pre_attn_scalar = 5;
  c.sliding_window = 3;
  c.layer_types = {"sliding_attention", "full_attention", "sliding_attention"};
  return c;
}

// The same as a Gemma 3 (text): Gemma 2's blocks with (1 + w) q/k norms, no soft-caps, layers 0
// and 1 local (window 3) on their own RoPE base 100, layer 2 global on rope_theta.
inline ModelConfig tiny_gemma3_config() {
  ModelConfig c = tiny_gemma2_config();
  c.model_type = "gemma3_text";
  c.attn_logit_softcapping = 0;
  c.final_logit_softcapping = 0;
  c.rope_local_base_freq = 100;
  c.layer_types = {"sliding_attention", "sliding_attention", "full_attention"};
  return c;
}

// The same as a Phi-3: q, k and v in one qkv_proj, gate and up in one gate_up_proj (GQA, untied).
inline ModelConfig tiny_phi3_config() {
  ModelConfig c = tiny_config(false, false);
  c.model_type = "phi3";
  return c;
}

// A random batch with shifted labels, some ignored; packed adds two documents per row.
inline Batch random_batch(int64_t B, int64_t T, int64_t V, uint64_t seed, bool packed = false) {
  Batch b;
  b.batch_size = B;
  b.seq_len = T;
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i < B * T; ++i) b.tokens.push_back(int32_t(rng() % uint64_t(V)));
  for (int64_t r = 0; r < B; ++r)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t split = T / 2;
      const bool second = packed && t >= split;
      b.positions.push_back(int32_t(second ? t - split : t));
      if (packed) b.doc_ids.push_back(second ? 1 : 0);
      const bool doc_end = t == T - 1 || (packed && t == split - 1);
      b.labels.push_back(doc_end || rng() % 5 == 0 ? kIgnoreIndex
                                                   : b.tokens[size_t(r * T + t + 1)]);
    }
  return b;
}

inline Tensor ids_tensor(const std::vector<int32_t>& v, Shape s) {
  Tensor t = Tensor::empty(std::move(s), DType::I32);
  for (size_t i = 0; i < v.size(); ++i) t.data<int32_t>()[i] = v[i];
  return t;
}

inline Tensor scalar_tensor(double x, DType dt) {
  Tensor t = Tensor::empty({}, dt);
  if (dt == DType::F64)
    t.data<double>()[0] = x;
  else
    t.data<float>()[0] = float(x);
  return t;
}

inline TensorMap batch_inputs(const Batch& b, DType dt, double loss_scale) {
  TensorMap m;
  Shape s{b.batch_size, b.seq_len};
  m["tokens"] = ids_tensor(b.tokens, s);
  m["labels"] = ids_tensor(b.labels, s);
  m["positions"] = ids_tensor(b.positions, s);
  if (!b.doc_ids.empty()) m["doc_ids"] = ids_tensor(b.doc_ids, s);
  m["loss_scale"] = scalar_tensor(loss_scale, dt);
  return m;
}

}  // namespace fusetune::testing
