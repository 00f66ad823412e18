#include "fusetune/peft/lora.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "fusetune/models/model_family.h"
#include "fusetune/peft/head_parts.h"
#include "fusetune/util/error.h"

namespace fusetune::peft {
namespace {

// torchtune attention names -> Hugging Face module names.
std::string hf_attn_name(const std::string& m) {
  if (m == "output_proj") return "o_proj";
  if (m == "q_proj" || m == "k_proj" || m == "v_proj") return m;
  throw Error("config key 'model.lora_attn_modules': unknown module '" + m +
              "' (expected q_proj, k_proj, v_proj, output_proj)");
}

bool ends_with(const std::string& s, const std::string& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

// The last component of a module name ("model.layers.0.self_attn.q_proj" -> "q_proj").
std::string leaf(const std::string& module) {
  auto p = module.rfind('.');
  return p == std::string::npos ? module : module.substr(p + 1);
}

// FNV-1a: a stable per-module salt for the dropout mask.
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

const char* const kEmbedWeight = "model.embed_tokens.weight";

Value dropout_seed(Graph& g) {
  for (size_t i = 0; i < g.nodes().size(); ++i)
    if (g.nodes()[i].op == Op::Input && g.nodes()[i].name == kDropoutSeedInput) return {int(i), 0};
  return g.input(kDropoutSeedInput, {}, DType::I32);
}

// The adapter's input x [rows, in] under lora_dropout: the mask drawn from the step's seed and
// the module's salt, so the fused distillation head (head_parts_hook) draws the same one.
Value lora_dropout_input(Graph& g, Value x, const LoraConfig& c, const std::string& module) {
  Attrs at;
  at.scalar = c.dropout;
  at.start = int64_t(fnv1a(module) >> 1);
  return g.add1(Op::Dropout, {x, dropout_seed(g)}, at);
}

// DoRA's per-output scale magnitude / ||W + s B A||_row [out] (the norm detached: RowInvNorm
// has no gradient). The merged weight is formed here, a weight-sized temporary (the fused
// distillation head's hook takes the norms tile by tile instead).
Value dora_column_scale(Builder& b, Value w, Value A, Value B, const LoraConfig& c,
                        const LinearSite& site) {
  Graph& g = b.graph();
  Value merged = b.add(w, b.scale(b.matmul(B, A), c.scale()));  // W + s B A  [out, in]
  Value inv_norm = g.add1(Op::RowInvNorm, {merged});
  Value mag = g.param(site.module + ".lora_magnitude_vector", {site.out}, true);
  return b.mul(mag, inv_norm);
}

}  // namespace

void LoraConfig::validate() const {
  FT_CHECK(rank >= 1, "config key 'model.lora_rank' must be >= 1, got " + std::to_string(rank));
  FT_CHECK(alpha >= 0, "config key 'model.lora_alpha' must be >= 0");
  FT_CHECK(dropout >= 0 && dropout < 1,
           "config key 'model.lora_dropout' must be in [0, 1), got " + std::to_string(dropout));
  for (const auto& m : attn_modules) hf_attn_name(m);
  FT_CHECK(!(use_dora && quantize_base),
           "config keys 'model.use_dora' and 'model.quantize_base': DoRA on an NF4 base is not "
           "supported yet");
  FT_CHECK(!target_modules(*this).empty(),
           "config key 'model.lora_attn_modules' is empty and neither apply_lora_to_mlp nor "
           "apply_lora_to_output is set: "
           "nothing would be trained");
}

std::vector<std::string> target_modules(const LoraConfig& c, bool fused) {
  std::vector<std::string> out;
  for (const char* m : {"q_proj", "k_proj", "v_proj", "output_proj"})
    if (std::find(c.attn_modules.begin(), c.attn_modules.end(), m) != c.attn_modules.end()) {
      const std::string hf =
          fused && std::string(m) != "output_proj" ? "qkv_proj" : hf_attn_name(m);
      if (std::find(out.begin(), out.end(), hf) == out.end()) out.push_back(hf);
    }
  if (c.apply_to_mlp && fused)
    for (const char* m : {"gate_up_proj", "down_proj"}) out.push_back(m);
  else if (c.apply_to_mlp)
    for (const char* m : {"gate_proj", "up_proj", "down_proj"}) out.push_back(m);
  if (c.apply_to_output) out.push_back("lm_head");
  return out;
}

void set_targets_from_hf(LoraConfig& c, const std::vector<std::string>& hf) {
  auto has = [&](const char* m) { return std::find(hf.begin(), hf.end(), m) != hf.end(); };
  c.attn_modules.clear();
  for (const char* m : {"q_proj", "k_proj", "v_proj"})
    if (has(m) || has("qkv_proj")) c.attn_modules.push_back(m);
  if (has("o_proj")) c.attn_modules.push_back("output_proj");
  const bool fused_mlp = has("gate_up_proj");
  c.apply_to_mlp = has("gate_proj") || has("up_proj") || has("down_proj") || fused_mlp;
  FT_CHECK(!c.apply_to_mlp || (fused_mlp ? has("down_proj") && !has("gate_proj") && !has("up_proj")
                                         : has("gate_proj") && has("up_proj") && has("down_proj")),
           "adapter target_modules name only some of gate_proj, up_proj, down_proj (or "
           "gate_up_proj, down_proj): not supported");
  c.apply_to_output = has("lm_head");
  for (const auto& m : hf)
    FT_CHECK(m == "q_proj" || m == "k_proj" || m == "v_proj" || m == "o_proj" || m == "gate_proj" ||
                 m == "up_proj" || m == "down_proj" || m == "lm_head" || m == "qkv_proj" ||
                 m == "gate_up_proj",
             "adapter target module '" + m + "' is not a Llama linear layer");
}

std::vector<bool> adapted_parts(const LoraConfig& c, const LinearSite& site) {
  if (site.parts.empty()) return {};
  if (leaf(site.module) == "gate_up_proj") return std::vector<bool>(site.parts.size(), true);
  std::vector<bool> on;
  for (const char* m : {"q_proj", "k_proj", "v_proj"})
    on.push_back(std::find(c.attn_modules.begin(), c.attn_modules.end(), m) !=
                 c.attn_modules.end());
  FT_CHECK(on.size() == site.parts.size(), "LoRA: '" + site.module + "' is not q, k, v");
  return on;
}

std::vector<LinearSite> lora_sites(const ModelConfig& m, const LoraConfig& c) {
  const bool fused = model_family(m.model_type).fused_projections;
  const auto targets = target_modules(c, fused);
  auto on = [&](const std::string& n) {
    return std::find(targets.begin(), targets.end(), n) != targets.end();
  };
  const int64_t D = m.hidden_size, F = m.intermediate_size, hd = m.head_dim;
  const int64_t H = m.num_attention_heads, KV = m.num_key_value_heads;
  std::vector<LinearSite> out;
  for (int64_t l = 0; l < m.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    auto add = [&](const std::string& sub, int64_t o, int64_t i) {
      if (on(leaf(sub))) out.push_back({p + sub, o, i, false, p + sub + ".weight"});
    };
    if (fused) {  // Phi-3: the row blocks as the builder slices them (models/llama.cpp)
      add("self_attn.qkv_proj", (H + 2 * KV) * hd, D);
      if (!out.empty() && leaf(out.back().module) == "qkv_proj" && out.back().parts.empty())
        out.back().parts = {H * hd, KV * hd, KV * hd};
      add("self_attn.o_proj", D, H * hd);
      add("mlp.gate_up_proj", 2 * F, D);
      if (!out.empty() && leaf(out.back().module) == "gate_up_proj" && out.back().parts.empty())
        out.back().parts = {F, F};
      add("mlp.down_proj", D, F);
      continue;
    }
    add("self_attn.q_proj", H * hd, D);
    add("self_attn.k_proj", KV * hd, D);
    add("self_attn.v_proj", KV * hd, D);
    add("self_attn.o_proj", D, H * hd);
    add("mlp.gate_proj", F, D);
    add("mlp.up_proj", F, D);
    add("mlp.down_proj", D, F);
  }
  if (on("lm_head"))
    out.push_back({"lm_head", m.vocab_size, D, false,
                   m.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"});
  return out;
}

bool is_adapter_param(const std::string& n) {
  return n.find(".lora_A.") != std::string::npos || n.find(".lora_B.") != std::string::npos ||
         ends_with(n, ".lora_magnitude_vector");
}

void init_adapters(TensorMap& params, const ModelConfig& model, const LoraConfig& c, uint64_t seed,
                   DType dtype, const NF4Store* nf4) {
  c.validate();
  std::mt19937_64 rng(seed ^ 0x10a4a11ce5eedull);
  auto uniform = [&] { return (double(rng() >> 11) + 0.5) * (1.0 / 9007199254740992.0); };
  for (const LinearSite& s : lora_sites(model, c)) {
    Tensor a = Tensor::empty({c.rank, s.in}, DType::F64);
    const double bound = 1.0 / std::sqrt(double(s.in));
    for (int64_t i = 0; i < a.numel(); ++i) a.data<double>()[i] = (2 * uniform() - 1) * bound;
    params[s.module + ".lora_A.weight"] = a.to(dtype);
    params[s.module + ".lora_B.weight"] = Tensor::zeros({s.out, c.rank}, dtype);
    if (!c.use_dora) continue;
    // m = ||W + s B A||_row = ||W||_row since B = 0.
    Tensor w;
    if (auto it = params.find(s.weight); it != params.end())
      w = it->second.to(DType::F64);
    else if (nf4 && nf4->count(s.weight))
      w = dequantize_nf4(nf4->at(s.weight), DType::F64);
    else
      throw Error("LoRA: the base weight '" + s.weight + "' is missing");
    Tensor m = Tensor::empty({s.out}, DType::F64);
    for (int64_t r = 0; r < s.out; ++r) {
      double acc = 0;
      for (int64_t j = 0; j < s.in; ++j)
        acc += w.data<double>()[r * s.in + j] * w.data<double>()[r * s.in + j];
      m.data<double>()[r] = std::sqrt(acc);
    }
    params[s.module + ".lora_magnitude_vector"] = m.to(dtype);
  }
}

namespace {

// B with the rows of the blocks of a fused projection that the config does not target times 0
// (a constant 0/1 mask [out, r]), so they stay 0 and get no gradient; B itself otherwise.
Value mask_unadapted_rows(Builder& b, Value B, const LoraConfig& c, const LinearSite& site) {
  const std::vector<bool> on = adapted_parts(c, site);
  if (std::find(on.begin(), on.end(), false) == on.end()) return B;
  FT_CHECK(!c.use_dora, "LoRA: DoRA on only some of q_proj, k_proj, v_proj of the fused '" +
                            site.module + "' is not supported (target all three or none)");
  Tensor mask = Tensor::zeros({site.out, c.rank}, DType::F64);
  int64_t row = 0;
  for (size_t p = 0; p < on.size(); ++p) {
    for (int64_t r = row; r < row + site.parts[p]; ++r)
      for (int64_t k = 0; k < c.rank; ++k) mask.data<double>()[r * c.rank + k] = on[p] ? 1 : 0;
    row += site.parts[p];
  }
  Graph& g = b.graph();
  return b.mul(B, g.constant(mask.to(g.type(B).dtype), site.module + ".lora_B.mask"));
}

// The hooks for the modules `c` targets (none: the frozen base alone).
LlamaOptions hooks_for(const LoraConfig& c, std::shared_ptr<const NF4Store> nf4,
                       const LlamaOptions& base = {}) {
  std::vector<std::string> targets = target_modules(c);
  for (const std::string& fused : target_modules(c, true)) targets.push_back(fused);
  FT_CHECK(!(nf4 && (base.linear || base.head)), "LoRA: an NF4 base and a base hook together");
  LinearFn fn = [c, targets, nf4, base](Builder& b, Value x, const LinearSite& site) -> Value {
    Graph& g = b.graph();
    const bool target =
        std::find(targets.begin(), targets.end(), leaf(site.module)) != targets.end();
    // The frozen base.
    Value w;  // the float base weight, when there is one (DoRA needs it)
    Value y;
    const LinearFn& base_fn = site.module == "lm_head" ? base.head : base.linear;
    if (nf4 && nf4->count(site.weight)) {
      y = nf4_linear(b, x, nf4->at(site.weight), site.weight);
    } else if (base_fn) {
      y = base_fn(b, x, site);
    } else {
      w = g.param(site.weight, {site.out, site.in}, site.trainable);
      y = b.linear(x, w);
    }
    if (!target) return y;
    const Shape xs = b.shape(x);
    const int64_t rows = shape_numel(xs) / site.in;
    Value x2 = b.reshape(x, {rows, site.in});
    Value y2 = b.reshape(y, {rows, site.out});
    if (c.dropout > 0) x2 = lora_dropout_input(g, x2, c, site.module);
    Value A = g.param(site.module + ".lora_A.weight", {c.rank, site.in}, true);
    Value B = g.param(site.module + ".lora_B.weight", {site.out, c.rank}, true);
    B = mask_unadapted_rows(b, B, c, site);
    Value lora = b.matmul(b.matmul(x2, A, false, true), B, false, true);  // [rows, out]
    Value out = b.add(y2, b.scale(lora, c.scale()));
    if (c.use_dora) {
      FT_CHECK(w.valid(), "DoRA needs a float base weight for '" + site.weight + "'");
      out = b.mul(out, dora_column_scale(b, w, A, B, c, site));
    }
    Shape os = xs;
    os.back() = site.out;
    return b.reshape(out, os);
  };
  LlamaOptions o;
  o.linear = fn;
  // The head goes through `fn` when it has an adapter or an NF4 base (tied: the embedding's).
  const bool nf4_head = nf4 && (nf4->count("lm_head.weight") || nf4->count(kEmbedWeight));
  if (c.apply_to_output || nf4_head || base.head) o.head = fn;
  o.embedding = base.embedding;
  if (nf4 && nf4->count(kEmbedWeight))
    o.embedding = [nf4](Builder& b, Value ids, const LinearSite& site) {
      return nf4_embedding(b, ids, nf4->at(site.weight), site.weight);
    };
  return o;
}

}  // namespace

LlamaOptions lora_llama_options(const LoraConfig& c, std::shared_ptr<const NF4Store> nf4,
                                const LlamaOptions* base) {
  c.validate();
  return base ? hooks_for(c, std::move(nf4), *base) : hooks_for(c, std::move(nf4));
}

LlamaOptions base_llama_options(std::shared_ptr<const NF4Store> nf4) {
  LoraConfig none;
  none.attn_modules.clear();
  none.apply_to_mlp = none.apply_to_output = false;
  return hooks_for(none, std::move(nf4));
}

}  // namespace fusetune::peft

// peft/head_parts.h (here rather than a file of its own: the unity build batches by file).
namespace fusetune::peft {

LinearFn head_parts_hook(const LoraConfig& c, std::function<const NF4Store*()> nf4,
                         std::shared_ptr<KdStudentHead> out) {
  return [c, nf4, out](Builder& b, Value x, const LinearSite& site) -> Value {
    Graph& g = b.graph();
    *out = KdStudentHead{};
    const NF4Store* store = nf4 ? nf4() : nullptr;
    if (store && store->count(site.weight)) {
      const NF4Weight& w = store->at(site.weight);
      const std::array<Value, 3> p = nf4_parts(g, w, site.weight);
      out->nf4.assign(p.begin(), p.end());
      out->nf4_shape = w.shape;
      out->nf4_offset = w.offset;
    } else {
      out->weight = g.param(site.weight, {site.out, site.in}, site.trainable);
    }
    if (c.apply_to_output) {
      // The lora hook's graph for these parts (hooks_for): the same dropout mask, the same
      // DoRA scale; the kernel applies them chunk by chunk.
      if (c.dropout > 0)
        out->lora_x = lora_dropout_input(
            g, b.reshape(x, {shape_numel(b.shape(x)) / site.in, site.in}), c, site.module);
      out->lora_A = g.param(site.module + ".lora_A.weight", {c.rank, site.in}, true);
      Value B = g.param(site.module + ".lora_B.weight", {site.out, c.rank}, true);
      out->lora_B_scaled = b.scale(B, c.scale());
      if (c.use_dora) {
        FT_CHECK(out->weight.valid(), "DoRA needs a float base weight for '" + site.weight + "'");
        // magnitude / ||W + s B A||_row, the norms a tile of merged rows at a time.
        Value inv_norm = g.add1(Op::RowInvNorm, {out->weight, out->lora_A, out->lora_B_scaled});
        Value mag = g.param(site.module + ".lora_magnitude_vector", {site.out}, true);
        out->col_scale = b.mul(mag, inv_norm);
      }
    }
    return Value{};
  };
}

}  // namespace fusetune::peft
