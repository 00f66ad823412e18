#include "fusetune/quant/qat.h"

#include "fusetune/config/schema.h"
#include "fusetune/models/model_family.h"
#include "fusetune/util/error.h"

namespace fusetune::quant {
namespace {

namespace k = kernels;
using kernels::FakeQuant;
using kernels::FakeQuantSpec;

const char* const kEmbedWeight = "model.embed_tokens.weight";

// The parameter `name`, created once per graph: a tied head reads the embedding's node.
Value param_once(Graph& g, const std::string& name, Shape shape, bool trainable) {
  for (size_t i = 0; i < g.nodes().size(); ++i)
    if (g.nodes()[i].op == Op::Param && g.nodes()[i].name == name) return {int(i), 0};
  return g.param(name, std::move(shape), trainable);
}

// The [] I32 switch: a graph input fed each step, or a constant 1 (always on).
Value enable_flag(Graph& g, bool switchable) {
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if ((n.op == Op::Input || n.op == Op::Constant) && n.name == kFakeQuantEnabledInput)
      return {int(i), 0};
  }
  if (switchable) return g.input(kFakeQuantEnabledInput, {}, DType::I32);
  Tensor one = Tensor::empty({}, DType::I32);
  one.data<int32_t>()[0] = 1;
  return g.constant(one, kFakeQuantEnabledInput);
}

Attrs fq_attrs(const FakeQuantSpec& s) {
  Attrs at;
  at.groups = int64_t(s.scheme);
  at.len = s.group;
  at.inverse = k::fake_quant_masks_gradient(s.scheme);
  return at;
}

FakeQuantSpec spec(FakeQuant scheme, int64_t group) { return {scheme, group}; }

// FakeQuantize(x2) for x2 = x or a reshape of x, reusing the node an earlier projection of the
// same input made (q/k/v and gate/up read one normed hidden state: one fake quantization).
Value fake_quantized_input(Graph& g, Value x, Value x2, Value on, const Attrs& at) {
  for (int i = int(g.nodes().size()) - 1; i >= 0 && i > x.node; --i) {
    const Node& n = g.nodes()[size_t(i)];
    if (n.op != Op::FakeQuantize || n.attrs.groups != at.groups || n.attrs.len != at.len ||
        !(n.inputs[1] == on) || g.shape(n.inputs[0]) != g.shape(x2))
      continue;
    const Value in = n.inputs[0];
    const Node& src = g.node(in);
    if (in == x || (src.op == Op::Reshape && src.inputs[0] == x)) return {i, 0};
  }
  return g.add1(Op::FakeQuantize, {x2, on}, at);
}

// Whether rows of `in` elements are whole groups of the spec.
bool fits(const FakeQuantSpec& s, int64_t in) {
  return s.scheme == FakeQuant::None || (s.group > 0 && in % s.group == 0);
}

}  // namespace

const char* scheme_name(QatScheme s) {
  switch (s) {
    case QatScheme::Int8DynActInt4Weight:
      return "Int8DynActInt4WeightQATQuantizer";
    case QatScheme::Int4WeightOnly:
      return "Int4WeightOnlyQATQuantizer";
    case QatScheme::GgufQ4_0:
      return "gguf_q4_0";
    case QatScheme::GgufQ8_0:
      return "gguf_q8_0";
  }
  return "?";
}

QatConfig qat_config_from(const Config& cfg) {
  QatConfig c;
  FT_CHECK(cfg.has("quantizer"),
           "a QAT recipe needs a 'quantizer' section (e.g. _component_: "
           "torchtune.training.quantization.Int8DynActInt4WeightQATQuantizer, groupsize: 256)");
  const std::string name = canonical_component(cfg, "quantizer");
  const Config q = cfg.sub("quantizer");
  if (name == "Int8DynActInt4WeightQATQuantizer") {
    c.scheme = QatScheme::Int8DynActInt4Weight;
  } else if (name == "Int4WeightOnlyQATQuantizer") {
    c.scheme = QatScheme::Int4WeightOnly;
  } else if (name == "gguf_q4_0") {
    c.scheme = QatScheme::GgufQ4_0;
  } else {
    FT_CHECK(name == "gguf_q8_0", "quantizer: unhandled component '" + name + "'");
    c.scheme = QatScheme::GgufQ8_0;
  }
  c.groupsize = q.i64("groupsize", 256);
  c.inner_k_tiles = q.i64("inner_k_tiles", 8);
  FT_CHECK(c.groupsize >= 1,
           "config key 'quantizer.groupsize' must be >= 1 (" + q.where("groupsize") + ")");
  if (cfg.has("fake_quant_after_n_steps"))
    c.fake_quant_after_n_steps = cfg.opt_i64("fake_quant_after_n_steps");
  FT_CHECK(!c.fake_quant_after_n_steps || *c.fake_quant_after_n_steps >= 0,
           "config key 'fake_quant_after_n_steps' must be >= 0 (" +
               cfg.where("fake_quant_after_n_steps") + ")");
  return c;
}

bool fake_quant_enabled_at(const QatConfig& c, int64_t global_step) {
  return !c.fake_quant_after_n_steps || global_step >= *c.fake_quant_after_n_steps;
}

SiteQuant site_quant(const QatConfig& c, const ModelConfig& model, const LinearSite& site) {
  SiteQuant q;
  const bool embedding = site.module == "model.embed_tokens";
  const bool head = site.module == "lm_head";
  const bool tied = model.tie_word_embeddings;
  switch (c.scheme) {
    case QatScheme::Int8DynActInt4Weight:
    case QatScheme::Int4WeightOnly: {
      // torchao replaces nn.Linear modules: the layers and an untied head.
      if (embedding || (head && tied)) return q;
      if (c.scheme == QatScheme::Int8DynActInt4Weight) {
        q.weight = spec(FakeQuant::Int4Symmetric, c.groupsize);
        q.activation = spec(FakeQuant::Int8PerToken, site.in);
      } else {
        q.weight = spec(FakeQuant::Uint4Asymmetric, c.groupsize);
        FT_CHECK(site.in % (16 * c.inner_k_tiles) == 0,
                 "quantizer: Int4WeightOnlyQATQuantizer needs rows that are multiples of 16 x "
                 "inner_k_tiles (" +
                     std::to_string(16 * c.inner_k_tiles) + "), but '" + site.module +
                     "' has rows of " + std::to_string(site.in) +
                     " (torchao refuses such a layer too)");
      }
      break;
    }
    case QatScheme::GgufQ4_0:
      // llama-quantize's defaults for Q4_0: layers and an untied token_embd Q4_0, the output
      // (and a tied model's one table) Q6_K with Q8_K activations, or Q8_0 when its rows are not
      // whole super-blocks of 256 (gguf::tensor_type_for).
      if (head || (embedding && tied)) {
        const bool k = site.in % 256 == 0;
        q.weight = k ? spec(FakeQuant::GgufQ6_K, 256) : spec(FakeQuant::GgufQ8_0, 32);
        if (!embedding)
          q.activation = k ? spec(FakeQuant::GgufQ8_K, 256) : spec(FakeQuant::GgufQ8_0, 32);
      } else {
        q.weight = spec(FakeQuant::GgufQ4_0, 32);
        if (!embedding) q.activation = spec(FakeQuant::GgufQ8_0, 32);
      }
      break;
    case QatScheme::GgufQ8_0:
      q.weight = spec(FakeQuant::GgufQ8_0, 32);
      if (!embedding) q.activation = spec(FakeQuant::GgufQ8_0, 32);
      break;
  }
  if (!fits(q.weight, site.in) || !fits(q.activation, site.in)) {
    // torchao's 8da4w quantizer and llama.cpp leave such a layer unquantized (llama.cpp cannot
    // store rows that are not whole blocks; fusetune's export keeps it F32, which llama.cpp
    // multiplies in F32); torchao's int4 weight-only QAT refuses it.
    FT_CHECK(c.scheme != QatScheme::Int4WeightOnly,
             "quantizer: Int4WeightOnlyQATQuantizer: '" + site.module + "' has rows of " +
                 std::to_string(site.in) + " elements, not a whole number of groups of " +
                 std::to_string(c.groupsize) +
                 " (config key 'quantizer.groupsize'); torchao "
                 "refuses such a layer too");
    return {};
  }
  return q;
}

std::vector<std::string> check_model(const QatConfig& c, const ModelConfig& m) {
  const int64_t D = m.hidden_size;
  const std::string p = "model.layers.0.";
  std::vector<std::string> float_sites;
  auto site = [](const std::string& module, int64_t out, int64_t in) {
    return LinearSite{module, out, in, true, module + ".weight"};
  };
  std::vector<LinearSite> sites;
  for (const LayerProjection& proj : layer_projections(m))
    sites.push_back(site(p + proj.module, proj.out, proj.in));
  sites.push_back(site("lm_head", m.vocab_size, D));
  sites.push_back(site("model.embed_tokens", m.vocab_size, D));
  for (const LinearSite& s : sites) {
    const SiteQuant q = site_quant(c, m, s);
    if (q.weight.scheme != FakeQuant::None || q.activation.scheme != FakeQuant::None) continue;
    const bool layer = s.module.rfind(p, 0) == 0;
    const bool by_policy = !layer && (c.scheme == QatScheme::Int8DynActInt4Weight ||
                                      c.scheme == QatScheme::Int4WeightOnly);
    if (!by_policy)
      float_sites.push_back((layer ? "model.layers.*." + s.module.substr(p.size()) : s.module) +
                            " (rows of " + std::to_string(s.in) + ")");
  }
  return float_sites;
}

LlamaOptions qat_llama_options(const QatConfig& c, std::shared_ptr<const ModelConfig> model,
                               bool switchable) {
  FT_CHECK(model != nullptr, "qat_llama_options: no model config");
  LinearFn linear = [c, model, switchable](Builder& b, Value x, const LinearSite& site) {
    Graph& g = b.graph();
    const SiteQuant q = site_quant(c, *model, site);
    Value w = param_once(g, site.weight, {site.out, site.in}, site.trainable);
    if (q.weight.scheme == FakeQuant::None && q.activation.scheme == FakeQuant::None)
      return b.linear(x, w);
    const Value on = enable_flag(g, switchable);
    const Shape xs = b.shape(x);
    Value x2 = b.reshape(x, {shape_numel(xs) / site.in, site.in});
    if (q.activation.scheme != FakeQuant::None)
      x2 = fake_quantized_input(g, x, x2, on, fq_attrs(q.activation));
    Value y = q.weight.scheme != FakeQuant::None
                  ? g.add1(Op::FakeQuantMatMul, {x2, w, on}, fq_attrs(q.weight), site.module)
                  : b.matmul(x2, w, false, true);
    Shape os = xs;
    os.back() = site.out;
    return b.reshape(y, os);
  };
  LlamaOptions o;
  o.linear = linear;
  const LinearSite head{"lm_head", model->vocab_size, model->hidden_size, false,
                        model->tie_word_embeddings ? kEmbedWeight : "lm_head.weight"};
  const LinearSite embed{"model.embed_tokens", model->vocab_size, model->hidden_size, false,
                         kEmbedWeight};
  if (site_quant(c, *model, head).weight.scheme != FakeQuant::None) o.head = linear;
  if (site_quant(c, *model, embed).weight.scheme != FakeQuant::None) {
    o.embedding = [c, model, switchable](Builder& b, Value ids, const LinearSite& site) {
      Graph& g = b.graph();
      const SiteQuant q = site_quant(c, *model, site);
      Value table = param_once(g, site.weight, {site.out, site.in}, site.trainable);
      // llama.cpp gathers rows of the quantized table (get_rows). Q4_0/Q8_0 blocks lie along
      // a row, so fake-quantizing the gathered rows gives exactly those values, without a
      // fake-quantized copy of the whole table (the straight-through gradient is dy either way).
      Value rows = b.embedding(table, ids);
      const Shape rs = b.shape(rows);
      Value flat = b.reshape(rows, {shape_numel(rs) / site.in, site.in});
      Value fq = g.add1(Op::FakeQuantize, {flat, enable_flag(g, switchable)}, fq_attrs(q.weight),
                        site.module);
      return b.reshape(fq, rs);
    };
  }
  return o;
}

}  // namespace fusetune::quant
