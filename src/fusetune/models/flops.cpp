#include "fusetune/models/flops.h"

#include "fusetune/models/model_family.h"

namespace fusetune {

double training_flops_per_token(const ModelConfig& c, int64_t seq_len,
                                const TrainablePredicate& trainable) {
  const double D = double(c.hidden_size), F = double(c.intermediate_size), hd = double(c.head_dim);
  const double H = double(c.num_attention_heads), KV = double(c.num_key_value_heads);
  auto linear = [&](const std::string& name, double in, double out) {
    return 2 * in * out * (trainable(name) ? 3.0 : 2.0);
  };
  double total = 0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    if (model_family(c.model_type).fused_projections) {  // Phi-3: qkv_proj, gate_up_proj
      total += linear(p + "self_attn.qkv_proj.weight", D, (H + 2 * KV) * hd) +
               linear(p + "self_attn.o_proj.weight", H * hd, D) +
               linear(p + "mlp.gate_up_proj.weight", D, 2 * F) +
               linear(p + "mlp.down_proj.weight", F, D) + 3 * 2 * 2 * double(seq_len) * hd * H;
      continue;
    }
    total += linear(p + "self_attn.q_proj.weight", D, H * hd) +
             linear(p + "self_attn.k_proj.weight", D, KV * hd) +
             linear(p + "self_attn.v_proj.weight", D, KV * hd) +
             linear(p + "self_attn.o_proj.weight", H * hd, D);
    total += linear(p + "mlp.gate_proj.weight", D, F) + linear(p + "mlp.up_proj.weight", D, F) +
             linear(p + "mlp.down_proj.weight", F, D);
    total += 3 * 2 * 2 * double(seq_len) * hd * H;
  }
  // A classifier's head is `score` [num_labels, D] (docs/design.md §12).
  if (c.num_labels > 0) return total + linear("score.weight", D, double(c.num_labels));
  const std::string head = c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  total += linear(head, D, double(c.vocab_size));
  return total;
}

}  // namespace fusetune
