#include "fusetune/models/llama.h"

#include <algorithm>
#include <cmath>

#include "fusetune/models/model_family.h"
#include "fusetune/models/rope_tables.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

struct Layer {
  Builder& b;
  const ModelConfig& cfg;
  const TrainablePredicate& trainable;
  const LinearFn& linear_fn;
  int64_t index;
  std::string prefix;

  Value param(const std::string& name, Shape shape) {
    std::string full = prefix + name;
    return b.graph().param(full, std::move(shape), trainable(full));
  }
  // x W^T for the projection `name` ("self_attn.q_proj") with W [out, in].
  Value linear(Value x, const std::string& name, int64_t out, int64_t in,
               std::vector<int64_t> parts = {}) {
    const std::string weight = prefix + name + ".weight";
    LinearSite site{prefix + name, out, in, trainable(weight), weight, std::move(parts)};
    return linear_fn(b, x, site);
  }
};

// RMSNorm with the stored weight w; a family whose norms scale by (1 + w) (Gemma) feeds the op
// w + 1, the Add of w and a Fill of ones, so RMSNorm, its kernels and its fusions stay one op
// and w's gradient passes through the Add unchanged (docs/design.md §1).
Value family_rmsnorm(Builder& b, const ModelConfig& c, Value x, Value w) {
  if (model_family(c.model_type).norm_adds_one) w = b.add(w, b.graph().fill(b.shape(w), 1.0));
  return b.rmsnorm(x, w, c.rms_norm_eps);
}

Value attention(Layer& L, Value x, const LlamaInputs& in, Value cos, Value sin, int64_t B,
                int64_t T) {
  Builder& b = L.b;
  const ModelConfig& c = L.cfg;
  const int64_t H = c.num_attention_heads, KV = c.num_key_value_heads, hd = c.head_dim,
                D = c.hidden_size;
  // Phi-3's qkv_proj: one product, sliced into q, k and v (rows in that order).
  Value qkv;
  if (model_family(c.model_type).fused_projections)
    qkv = L.linear(x, "self_attn.qkv_proj", (H + 2 * KV) * hd, D, {H * hd, KV * hd, KV * hd});
  auto proj = [&](const std::string& name, int64_t heads) {
    if (qkv.valid()) {
      const int64_t start = name == "q_proj" ? 0 : name == "k_proj" ? H * hd : (H + KV) * hd;
      return b.reshape(b.slice(qkv, 2, start, heads * hd), {B, T, heads, hd});
    }
    Value y = L.linear(x, "self_attn." + name, heads * hd, D);
    if (c.attention_bias) y = b.add(y, L.param("self_attn." + name + ".bias", {heads * hd}));
    return b.reshape(y, {B, T, heads, hd});
  };
  // Qwen3: each head of q and k RMS-normalized over head_dim before RoPE.
  const bool qk_norm = model_family(c.model_type).qk_norm;
  auto head_norm = [&](Value y, const char* norm) {
    return qk_norm ? family_rmsnorm(b, c, y,
                                    L.param(std::string("self_attn.") + norm + ".weight", {hd}))
                   : y;
  };
  Value q = b.rope(head_norm(proj("q_proj", H), "q_norm"), cos, sin, in.positions);
  Value k = b.rope(head_norm(proj("k_proj", KV), "k_norm"), cos, sin, in.positions);
  Value v = proj("v_proj", KV);
  // Gemma 2 scales by query_pre_attn_scalar^-1/2, caps the scores and windows its local layers.
  const double scale =
      1.0 / std::sqrt(c.query_pre_attn_scalar > 0 ? c.query_pre_attn_scalar : double(hd));
  const int64_t window = is_sliding_layer(c, L.index) ? c.sliding_window : 0;
  if (in.cache_len > 0) {
    Graph& g = b.graph();
    const Shape cache_shape{B, in.cache_len, KV, hd};
    const std::string layer = std::to_string(L.index);
    Value k_cache = g.input("kv_cache.k." + layer, cache_shape, g.compute_dtype());
    Value v_cache = g.input("kv_cache.v." + layer, cache_shape, g.compute_dtype());
    Attrs at;
    at.scalar = scale;
    at.softcap = c.attn_logit_softcapping;
    at.window = window;
    Value ctx =
        g.add1(Op::KVCacheAttention, {q, k, v, k_cache, v_cache, in.cache_pos, in.cache_start}, at);
    return L.linear(b.reshape(ctx, {B, T, H * hd}), "self_attn.o_proj", D, H * hd);
  }
  q = b.transpose(q, 1, 2);                          // [B, H, T, hd]
  k = b.repeat_heads(b.transpose(k, 1, 2), H / KV);  // [B, H, T, hd]
  v = b.repeat_heads(b.transpose(v, 1, 2), H / KV);
  Value scores = b.scale(b.matmul(q, k, false, true), scale);  // [B, H, T, T]
  if (c.attn_logit_softcapping > 0) scores = b.softcap(scores, c.attn_logit_softcapping);
  Value probs = b.softmax(b.causal_mask(scores, in.doc_ids, window));
  Value ctx = b.transpose(b.matmul(probs, v), 1, 2);  // [B, T, H, hd]
  ctx = b.reshape(ctx, {B, T, H * hd});
  return L.linear(ctx, "self_attn.o_proj", D, H * hd);
}

Value mlp(Layer& L, Value x) {
  Builder& b = L.b;
  const int64_t D = L.cfg.hidden_size, F = L.cfg.intermediate_size;
  Value gate, up;
  if (model_family(L.cfg.model_type).fused_projections) {
    // Phi-3's gate_up_proj: gate rows, then up rows.
    Value gate_up = L.linear(x, "mlp.gate_up_proj", 2 * F, D, {F, F});
    const int last = int(b.shape(gate_up).size()) - 1;
    gate = b.slice(gate_up, last, 0, F);
    up = b.slice(gate_up, last, F, F);
  } else {
    gate = L.linear(x, "mlp.gate_proj", F, D);
    up = L.linear(x, "mlp.up_proj", F, D);
  }
  // SwiGLU, or Gemma's GeGLU (compile/fuse_swiglu matches Silu only and leaves it alone).
  Value act = L.cfg.hidden_act == kGeluTanh ? b.gelu_tanh(gate) : b.silu(gate);
  return L.linear(b.mul(act, up), "mlp.down_proj", D, F);
}

}  // namespace

Value default_linear(Builder& b, Value x, const LinearSite& site) {
  Value w = b.graph().param(site.weight, {site.out, site.in}, site.trainable);
  return b.linear(x, w);
}

LlamaOutputs build_llama(Builder& b, const ModelConfig& cfg, const LlamaInputs& in,
                         const TrainablePredicate& trainable, const LlamaOptions& options) {
  const LinearFn linear_fn = options.linear ? options.linear : LinearFn(default_linear);
  Graph& g = b.graph();
  const Shape& ts = g.shape(in.tokens);
  const int64_t B = ts[0], T = ts[1], D = cfg.hidden_size, V = cfg.vocab_size;

  // Positions index the tables: with a cache they run up to its length.
  auto [cos_t, sin_t] = rope_tables(cfg, std::max(T, in.cache_len), g.compute_dtype());
  Value cos = g.constant(cos_t, "rope.cos");
  Value sin = g.constant(sin_t, "rope.sin");
  // Gemma 3's local layers rotate by their own base, unscaled.
  Value cos_local = cos, sin_local = sin;
  if (cfg.rope_local_base_freq > 0) {
    ModelConfig local = cfg;
    local.rope_theta = cfg.rope_local_base_freq;
    local.rope_scaling = RopeScaling{};
    auto [lc, ls] = rope_tables(local, std::max(T, in.cache_len), g.compute_dtype());
    cos_local = g.constant(lc, "rope.cos.local");
    sin_local = g.constant(ls, "rope.sin.local");
  }

  const std::string ew = "model.embed_tokens.weight";
  Value embed;  // the float table, when there is one (a tied head reuses it)
  Value h;      // [B, T, D]
  if (options.embedding) {
    h = options.embedding(b, in.tokens, LinearSite{"model.embed_tokens", V, D, trainable(ew), ew});
  } else {
    embed = g.param(ew, {V, D}, trainable(ew));
    h = b.embedding(embed, in.tokens);
  }
  if (model_family(cfg.model_type).scales_embedding) {
    // Gemma: times sqrt(hidden_size), a constant transformers rounds to the hidden dtype.
    float normalizer = float(std::sqrt(double(D)));
    if (g.float_dtype() == DType::BF16) normalizer = bf16_to_f32(f32_to_bf16(normalizer));
    h = b.scale(h, double(normalizer));
  }
  const bool post_norms = model_family(cfg.model_type).post_norms;
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    Layer L{b, cfg, trainable, linear_fn, i, "model.layers." + std::to_string(i) + "."};
    g.set_layer(int(i));
    Value attn_in = family_rmsnorm(b, cfg, h, L.param("input_layernorm.weight", {D}));
    const bool local = is_sliding_layer(cfg, i);
    Value attn_out =
        attention(L, attn_in, in, local ? cos_local : cos, local ? sin_local : sin, B, T);
    if (post_norms) {  // Gemma 2 (model_family.h)
      auto norm = [&](Value x, const char* name) {
        return family_rmsnorm(b, cfg, x, L.param(std::string(name) + ".weight", {D}));
      };
      h = b.add(h, norm(attn_out, "post_attention_layernorm"));
      h = b.add(h,
                norm(mlp(L, norm(h, "pre_feedforward_layernorm")), "post_feedforward_layernorm"));
      continue;
    }
    h = b.add(h, attn_out);
    Value mlp_in = family_rmsnorm(b, cfg, h, L.param("post_attention_layernorm.weight", {D}));
    h = b.add(h, mlp(L, mlp_in));
  }
  g.set_layer(-1);
  Value norm_w = g.param("model.norm.weight", {D}, trainable("model.norm.weight"));
  if (options.last_position_only) h = b.slice(h, 1, T - 1, 1);  // [B, 1, D]
  const int64_t rows = options.last_position_only ? B : B * T;
  Value hidden = b.reshape(family_rmsnorm(b, cfg, h, norm_w), {rows, D});
  // Gemma 2's final-logit soft-cap: the model returns capped logits, and compile: true folds
  // the Softcap into the fused head kernels (docs/design.md §3).
  const double cap = cfg.final_logit_softcapping;
  if (cfg.num_labels > 0) {  // a classifier: the score head instead of lm_head (§12)
    FT_CHECK(!options.head, "build_llama: a sequence classifier's score head takes no head hook");
    Value score = g.param("score.weight", {cfg.num_labels, D}, trainable("score.weight"));
    LlamaOutputs out;
    out.hidden = hidden;
    out.scores = b.matmul(hidden, score, false, true);
    return out;
  }
  if (options.head) {
    // The head as a linear site; a tied head's weight is the embedding.
    const std::string w = cfg.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    LinearSite site{"lm_head", V, D, trainable(w), w};
    Value logits = options.head(b, hidden, site);
    return {hidden, Value{}, cap > 0 ? b.softcap(logits, cap) : logits, Value{}};
  }
  FT_CHECK(!cfg.tie_word_embeddings || embed.valid(),
           "build_llama: a tied model with an embedding hook needs a head hook too");
  Value head = cfg.tie_word_embeddings
                   ? embed
                   : g.param("lm_head.weight", {V, D}, trainable("lm_head.weight"));
  if (cap > 0)
    return {hidden, Value{}, b.softcap(b.matmul(hidden, head, false, true), cap), Value{}};
  return {hidden, head, Value{}, Value{}};
}

}  // namespace fusetune
