#include "fusetune/io/hf_config.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "fusetune/models/model_family.h"
#include "fusetune/util/error.h"
#include "fusetune/util/fs.h"
#include "fusetune/util/strings.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace fusetune {
namespace {

// Reads typed keys from config.json; absent and null both mean "use the default".
class Reader {
 public:
  Reader(const json& j, const std::string& source) : j_(j), src_(source) {}

  bool present(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }

  int64_t integer(const char* key, int64_t def, bool required = false) const {
    if (!present(key)) {
      FT_CHECK(!required, src_ + ": missing required key '" + key + "'");
      return def;
    }
    return as_int(j_[key], key);
  }
  double number(const char* key, double def) const {
    if (!present(key)) return def;
    FT_CHECK(j_[key].is_number(), src_ + ": '" + key + "' must be a number, got " + j_[key].dump());
    return j_[key].get<double>();
  }
  bool boolean(const char* key, bool def) const {
    if (!present(key)) return def;
    FT_CHECK(j_[key].is_boolean(),
             src_ + ": '" + key + "' must be true or false, got " + j_[key].dump());
    return j_[key].get<bool>();
  }
  std::string string(const char* key, const std::string& def) const {
    if (!present(key)) return def;
    FT_CHECK(j_[key].is_string(), src_ + ": '" + key + "' must be a string, got " + j_[key].dump());
    return j_[key].get<std::string>();
  }
  int64_t as_int(const json& v, const std::string& key) const {
    FT_CHECK(v.is_number_integer(), src_ + ": '" + key + "' must be an integer, got " + v.dump());
    if (v.is_number_unsigned())
      FT_CHECK(v.get<uint64_t>() <= uint64_t(std::numeric_limits<int64_t>::max()),
               src_ + ": '" + key + "' is too large: " + v.dump());
    return v.get<int64_t>();
  }

 private:
  const json& j_;
  const std::string& src_;
};

// LongRoPE (Phi-3's 128k models) as transformers' _compute_longrope_parameters reads it: a
// top-level original_max_position_embeddings (Phi-3's) sets factor = max_position_embeddings /
// it; attention_factor defaults to sqrt(1 + ln(factor) / ln(original)) when factor > 1.
void parse_longrope(const Reader& r, const json& rs, const std::string& src, const json& config,
                    int64_t max_positions, RopeScaling& out) {
  auto factors = [&](const char* key) {
    FT_CHECK(rs.contains(key) && rs[key].is_array(),
             src + ": rope_scaling of type 'longrope' needs '" + key + "' (a list of numbers)");
    std::vector<double> v;
    for (const json& x : rs[key]) {
      FT_CHECK(x.is_number() && x.get<double>() > 0 && std::isfinite(x.get<double>()),
               src + ": rope_scaling '" + key + "' must hold positive numbers, got " + x.dump());
      v.push_back(x.get<double>());
    }
    return v;
  };
  out.short_factor = factors("short_factor");
  out.long_factor = factors("long_factor");
  const Reader top(config, src);
  if (top.present("original_max_position_embeddings")) {
    out.original_max_position_embeddings = top.integer("original_max_position_embeddings", 0);
    FT_CHECK(out.original_max_position_embeddings > 0,
             src + ": 'original_max_position_embeddings' must be positive");
    out.factor = double(max_positions) / double(out.original_max_position_embeddings);
  } else {
    out.original_max_position_embeddings =
        r.integer("original_max_position_embeddings", max_positions);
    out.factor = r.number("factor", 1.0);
  }
  out.attention_factor =
      r.present("attention_factor") ? r.number("attention_factor", 1.0)
      : out.factor <= 1.0
          ? 1.0
          : std::sqrt(1 + std::log(out.factor) /
                              std::log(double(out.original_max_position_embeddings)));
}

RopeScaling parse_rope_scaling(const json& rs, const std::string& src, const json& config,
                               int64_t max_positions) {
  RopeScaling out;
  if (rs.is_null()) return out;
  FT_CHECK(rs.is_object(), src + ": 'rope_scaling' must be null or an object, got " + rs.dump());
  Reader r(rs, src);
  // transformers reads "rope_type" and falls back to the legacy "type".
  std::string type = r.string("rope_type", r.string("type", ""));
  FT_CHECK(!type.empty(), src + ": 'rope_scaling' has neither 'rope_type' nor 'type'");
  if (type == "default") return out;  // plain RoPE spelled out
  auto need = [&](const char* key) {
    FT_CHECK(r.present(key), src + ": rope_scaling of type '" + type + "' needs '" + key + "'");
  };
  if (type == "linear") {
    need("factor");
    out.rope_type = type;
    out.factor = r.number("factor", 1.0);
  } else if (type == "llama3") {
    for (const char* k :
         {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
      need(k);
    out.rope_type = type;
    out.factor = r.number("factor", 1.0);
    out.low_freq_factor = r.number("low_freq_factor", 1.0);
    out.high_freq_factor = r.number("high_freq_factor", 4.0);
    out.original_max_position_embeddings = r.integer("original_max_position_embeddings", 8192);
  } else if (type == "longrope") {
    out.rope_type = type;
    parse_longrope(r, rs, src, config, max_positions, out);
  } else {
    throw Error(src + ": rope_scaling type '" + type +
                "' is not supported (supported: llama3, linear, longrope)");
  }
  return out;
}

// Gemma 2's soft-caps (a null cap is none, as in transformers), query_pre_attn_scalar and the
// layers that attend within the sliding window (layer_types, or the family's pattern).
void parse_layer_options(const Reader& r, const json& j, const ModelFamily& family, ModelConfig& c,
                         const std::string& src) {
  if (family.reads_softcaps) {
    auto cap = [&](const char* key, double def) {
      return j.contains(key) && j[key].is_null() ? 0.0 : r.number(key, def);
    };
    c.attn_logit_softcapping = cap("attn_logit_softcapping", family.default_attn_softcap);
    c.final_logit_softcapping = cap("final_logit_softcapping", family.default_final_softcap);
  }
  if (family.reads_query_pre_attn_scalar)
    c.query_pre_attn_scalar = r.number("query_pre_attn_scalar", double(c.head_dim));
  if (family.default_rope_local_base_freq > 0)
    c.rope_local_base_freq = r.number("rope_local_base_freq", family.default_rope_local_base_freq);
  if (family.sliding_pattern == 0) return;
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    const json& t = j["layer_types"];
    FT_CHECK(t.is_array() && int64_t(t.size()) == c.num_hidden_layers,
             src + ": 'layer_types' must list one type per layer (" +
                 std::to_string(c.num_hidden_layers) + ")");
    for (const json& v : t) {
      const std::string s = v.is_string() ? v.get<std::string>() : v.dump();
      FT_CHECK(s == "sliding_attention" || s == "full_attention",
               src + ": layer_types entry '" + s +
                   "' is not supported (supported: sliding_attention, full_attention)");
      c.layer_types.push_back(s);
    }
    return;
  }
  const int64_t pattern = r.integer("sliding_window_pattern", family.sliding_pattern);
  FT_CHECK(pattern > 0, src + ": 'sliding_window_pattern' must be positive");
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    c.layer_types.push_back((i + 1) % pattern ? "sliding_attention" : "full_attention");
}

// Whether config.json's `architectures` names a sequence classifier (docs/design.md §12).
bool names_classifier(const json& j) {
  if (!j.contains("architectures") || !j["architectures"].is_array() || j["architectures"].empty())
    return false;
  const json& a = j["architectures"][0];
  const std::string suffix = "ForSequenceClassification";
  return a.is_string() && a.get<std::string>().size() > suffix.size() &&
         a.get<std::string>().compare(a.get<std::string>().size() - suffix.size(), suffix.size(),
                                      suffix) == 0;
}

// transformers' *ForSequenceClassification: num_labels from the key, else from id2label's size,
// else transformers' default 2; pad_token_id finds each row's last real token there.
void parse_classifier(const Reader& r, const json& j, ModelConfig& c) {
  if (!names_classifier(j)) return;
  int64_t labels = 2;
  if (j.contains("id2label") && j["id2label"].is_object()) labels = int64_t(j["id2label"].size());
  c.num_labels = r.integer("num_labels", labels);
  c.pad_token_id = r.integer("pad_token_id", -1);
}

}  // namespace

void validate_model_config(const ModelConfig& c, const std::string& src) {
  // Upper bounds far above any real model keep shape arithmetic (V * D, ...) from overflowing.
  auto positive = [&](const char* key, int64_t v, int64_t limit = int64_t(1) << 24) {
    FT_CHECK(v > 0, src + ": '" + key + "' must be positive, got " + std::to_string(v));
    FT_CHECK(v <= limit, src + ": '" + key + "' = " + std::to_string(v) +
                             " is implausibly large (limit " + std::to_string(limit) + ")");
  };
  const ModelFamily& family = model_family(c.model_type, src);
  positive("vocab_size", c.vocab_size);
  positive("hidden_size", c.hidden_size);
  positive("intermediate_size", c.intermediate_size);
  positive("num_hidden_layers", c.num_hidden_layers, 100000);
  positive("num_attention_heads", c.num_attention_heads);
  positive("num_key_value_heads", c.num_key_value_heads);
  positive("head_dim", c.head_dim);
  positive("max_position_embeddings", c.max_position_embeddings, int64_t(1) << 40);
  FT_CHECK(c.num_attention_heads % c.num_key_value_heads == 0,
           src + ": num_key_value_heads (" + std::to_string(c.num_key_value_heads) +
               ") must divide num_attention_heads (" + std::to_string(c.num_attention_heads) + ")");
  FT_CHECK(c.head_dim % 2 == 0, src + ": head_dim must be even for rotary embeddings, got " +
                                    std::to_string(c.head_dim));
  FT_CHECK(c.rms_norm_eps > 0 && std::isfinite(c.rms_norm_eps),
           src + ": 'rms_norm_eps' must be positive and finite");
  FT_CHECK(c.rope_theta > 0 && std::isfinite(c.rope_theta),
           src + ": 'rope_theta' must be positive and finite");
  FT_CHECK(c.sliding_window >= 0, src + ": 'sliding_window' must be positive or null");
  FT_CHECK(c.num_labels >= 0 && c.num_labels <= (int64_t(1) << 24),
           src + ": 'num_labels' must be positive, got " + std::to_string(c.num_labels));
  for (auto [key, v] : {std::pair{"attn_logit_softcapping", c.attn_logit_softcapping},
                        {"final_logit_softcapping", c.final_logit_softcapping},
                        {"query_pre_attn_scalar", c.query_pre_attn_scalar},
                        {"rope_local_base_freq", c.rope_local_base_freq}})
    FT_CHECK(
        v >= 0 && std::isfinite(v),
        src + ": '" + key + "' must be positive and finite (or null), got " + std::to_string(v));
  FT_CHECK(c.layer_types.empty() || int64_t(c.layer_types.size()) == c.num_hidden_layers,
           src + ": 'layer_types' must list one type per layer");
  FT_CHECK(c.layer_types.empty() || c.sliding_window > 0 ||
               std::count(c.layer_types.begin(), c.layer_types.end(), "sliding_attention") == 0,
           src + ": sliding_attention layers need a positive 'sliding_window'");
  FT_CHECK(c.hidden_act == "silu" || c.hidden_act == "swish" || c.hidden_act == kGeluTanh,
           src + ": " + std::string(family.activation_key) + " '" + c.hidden_act +
               "' is not supported (supported: silu, " + kGeluTanh + ")");
  FT_CHECK(!c.mlp_bias, src +
                            ": mlp_bias: true is not supported (no Llama-family "
                            "checkpoint uses MLP biases)");
  // HF's llama/mistral/qwen3 `attention_bias` also puts a bias on o_proj; only Qwen2's
  // q/k/v-only biases are modelled here. Qwen2's config.json has no attention_bias key (the
  // biases are always there), so a qwen2 config without them could not be saved and loaded
  // back as the same model.
  FT_CHECK(c.attention_bias || !family.qkv_bias,
           src + ": model_type '" + c.model_type +
               "' always has q/k/v biases (attention_bias must be true)");
  FT_CHECK(!c.attention_bias || family.qkv_bias,
           src + ": attention_bias: true is not supported for model_type '" + c.model_type +
               "' (only qwen2's q/k/v biases are)");
  const auto& rs = c.rope_scaling;
  if (!rs.rope_type.empty()) {
    FT_CHECK(rs.rope_type == "llama3" || rs.rope_type == "linear" || rs.rope_type == "longrope",
             src + ": rope_scaling type '" + rs.rope_type +
                 "' is not supported (supported: llama3, linear, longrope)");
    if (rs.rope_type == "longrope")
      FT_CHECK(int64_t(rs.short_factor.size()) == c.head_dim / 2 &&
                   int64_t(rs.long_factor.size()) == c.head_dim / 2,
               src + ": rope_scaling 'short_factor' and 'long_factor' need head_dim / 2 = " +
                   std::to_string(c.head_dim / 2) + " entries each, got " +
                   std::to_string(rs.short_factor.size()) + " and " +
                   std::to_string(rs.long_factor.size()));
    FT_CHECK(rs.factor > 0 && std::isfinite(rs.factor),
             src + ": rope_scaling 'factor' must be positive and finite");
    if (rs.rope_type == "llama3") {
      FT_CHECK(rs.low_freq_factor > 0 && rs.low_freq_factor < rs.high_freq_factor &&
                   std::isfinite(rs.high_freq_factor),
               src + ": rope_scaling needs 0 < low_freq_factor < high_freq_factor");
      FT_CHECK(rs.original_max_position_embeddings > 0,
               src + ": rope_scaling 'original_max_position_embeddings' must be positive");
    }
  }
}

namespace {

// A multimodal checkpoint's config.json (Gemma3ForConditionalGeneration): the text model from
// its text_config (model_type and the sizes it leaves out at transformers' defaults), with the
// outer file's token ids where text_config has none; vision_config is not read.
ModelConfig parse_multimodal_config(const json& j, const ModelFamily& family,
                                    const std::string& src) {
  const std::string outer_type = j["model_type"].get<std::string>();
  FT_CHECK(j.contains("text_config") && j["text_config"].is_object(),
           src + ": model_type '" + outer_type +
               "' needs a 'text_config' object (the text model's keys; fusetune trains the text "
               "model of a multimodal checkpoint)");
  json text = j["text_config"];
  if (!text.contains("model_type")) text["model_type"] = family.model_type;
  FT_CHECK(text["model_type"] == family.model_type,
           src + ": text_config's model_type must be '" + std::string(family.model_type) +
               "' in a '" + outer_type + "' config, got " + text["model_type"].dump());
  if (!family.multimodal_text_defaults.empty()) {
    const json defaults = json::parse(family.multimodal_text_defaults);
    for (const auto& [key, value] : defaults.items())
      if (!text.contains(key)) text[key] = value;
  }
  std::vector<std::string> taken;
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"})
    if (!text.contains(key) && j.contains(key)) {
      text[key] = j[key];
      taken.push_back(key);
    }
  ModelConfig c = parse_model_config(text, src + " (text_config)");
  c.raw = j["text_config"];
  c.multimodal = j;
  c.ids_from_multimodal = taken;
  return c;
}

}  // namespace

ModelConfig parse_model_config(const json& j, const std::string& src) {
  FT_CHECK(j.is_object(),
           src + ": expected a JSON object, got a JSON " + std::string(j.type_name()));
  if (j.contains("model_type") && j["model_type"].is_string())
    if (const ModelFamily* text = multimodal_family(j["model_type"].get<std::string>()))
      return parse_multimodal_config(j, *text, src);
  Reader r(j, src);
  ModelConfig c;
  FT_CHECK(r.present("model_type"),
           src + ": missing required key 'model_type' (supported: " + model_type_list() + ")");
  c.model_type = r.string("model_type", "");
  const ModelFamily& family = model_family(c.model_type, src);
  c.vocab_size = r.integer("vocab_size", 0, true);
  c.hidden_size = r.integer("hidden_size", 0, true);
  c.intermediate_size = r.integer("intermediate_size", 0, true);
  c.num_hidden_layers = r.integer("num_hidden_layers", 0, true);
  c.num_attention_heads = r.integer("num_attention_heads", 0, true);
  FT_CHECK(c.num_attention_heads > 0, src + ": 'num_attention_heads' must be positive, got " +
                                          std::to_string(c.num_attention_heads));
  c.num_key_value_heads = r.integer("num_key_value_heads", c.num_attention_heads);
  if (r.present("head_dim") || family.default_head_dim > 0) {
    c.head_dim = r.integer("head_dim", family.default_head_dim);
  } else {
    FT_CHECK(c.hidden_size % c.num_attention_heads == 0,
             src + ": num_attention_heads (" + std::to_string(c.num_attention_heads) +
                 ") must divide hidden_size (" + std::to_string(c.hidden_size) +
                 ") when head_dim is not given");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  // transformers' per-architecture defaults.
  c.max_position_embeddings =
      r.integer("max_position_embeddings", family.default_max_position_embeddings);
  c.rms_norm_eps = r.number("rms_norm_eps", family.default_rms_norm_eps);
  c.rope_theta = r.number("rope_theta", family.default_rope_theta);
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", family.default_tie_word_embeddings);
  c.hidden_act =
      r.string(std::string(family.activation_key).c_str(), std::string(family.default_activation));
  // Qwen2 always has q/k/v biases and its config has no attention_bias key.
  c.attention_bias = family.qkv_bias ? true : r.boolean("attention_bias", false);
  c.mlp_bias = r.boolean("mlp_bias", false);
  if (j.contains("rope_scaling"))
    c.rope_scaling = parse_rope_scaling(j["rope_scaling"], src, j, c.max_position_embeddings);
  // Phi-3's partial_rotary_factor (Phi-4-mini: 0.75) rotates only part of each head.
  FT_CHECK(r.number("partial_rotary_factor", 1.0) == 1.0,
           src +
               ": partial_rotary_factor other than 1 is not supported (RoPE rotates every "
               "dimension of a head here)");
  c.bos_token_id = r.integer("bos_token_id", family.default_bos_token_id);
  if (r.present("eos_token_id")) {
    const json& e = j["eos_token_id"];
    if (e.is_array()) {
      FT_CHECK(!e.empty(), src + ": 'eos_token_id' is an empty list");
      for (const auto& v : e) c.eos_token_ids.push_back(r.as_int(v, "eos_token_id"));
    } else {
      c.eos_token_ids.push_back(r.as_int(e, "eos_token_id"));
    }
    c.eos_token_id = c.eos_token_ids.front();
  } else if (family.default_eos_token_id >= 0 && !j.contains("eos_token_id")) {
    c.eos_token_id = family.default_eos_token_id;
    c.eos_token_ids = {family.default_eos_token_id};
  }
  // The window only matters past its length; stored so that the model can refuse longer
  // sequences. Qwen2/3 apply it only with use_sliding_window.
  if (family.sliding_window == SlidingWindowKey::Always ||
      (family.sliding_window == SlidingWindowKey::WithUseSlidingWindow &&
       r.boolean("use_sliding_window", false)))
    c.sliding_window = r.integer("sliding_window", family.default_sliding_window);
  parse_layer_options(r, j, family, c, src);
  parse_classifier(r, j, c);
  c.raw = j;
  validate_model_config(c, src);
  return c;
}

namespace {

// A classifier's config.json (docs/design.md §12): its *ForSequenceClassification class (also
// for a causal LM turned into one), id2label/label2id of num_labels entries as transformers
// writes them, and pad_token_id.
void write_classifier_keys(const ModelConfig& c, const ModelFamily& family, json& j) {
  if (!names_classifier(j))
    j["architectures"] = json::array({sequence_classification_architecture(family)});
  if (!j.contains("id2label") || !j["id2label"].is_object() ||
      int64_t(j["id2label"].size()) != c.num_labels) {
    json id2label = json::object(), label2id = json::object();
    for (int64_t i = 0; i < c.num_labels; ++i) {
      id2label[std::to_string(i)] = "LABEL_" + std::to_string(i);
      label2id["LABEL_" + std::to_string(i)] = i;
    }
    j["id2label"] = id2label;
    j["label2id"] = label2id;
  }
  if (j.contains("num_labels")) j["num_labels"] = c.num_labels;
  if (c.pad_token_id >= 0) j["pad_token_id"] = c.pad_token_id;
}

json text_model_config_to_json(const ModelConfig& c, bool top_level) {
  json j = c.raw.is_object() ? c.raw : json::object();
  const ModelFamily& family = model_family(c.model_type);
  if (top_level && !j.contains("architectures"))
    j["architectures"] = json::array({std::string(family.hf_architecture)});
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  // Written unless reading the file back would imply it (the family's default, else
  // hidden_size / num_attention_heads).
  const int64_t implied_head_dim =
      family.default_head_dim > 0 ? family.default_head_dim
                                  : c.hidden_size / std::max<int64_t>(c.num_attention_heads, 1);
  if (j.contains("head_dim") || c.head_dim != implied_head_dim ||
      c.head_dim * c.num_attention_heads != c.hidden_size)
    j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j[std::string(family.activation_key)] = c.hidden_act;
  if (family.writes_attention_bias) j["attention_bias"] = c.attention_bias;
  if (family.writes_mlp_bias) j["mlp_bias"] = c.mlp_bias;
  const auto& rs = c.rope_scaling;
  if (rs.rope_type.empty()) {
    if (j.contains("rope_scaling") || family.writes_null_rope_scaling) j["rope_scaling"] = nullptr;
  } else {
    json o = j.contains("rope_scaling") && j["rope_scaling"].is_object() ? j["rope_scaling"]
                                                                         : json::object();
    if (rs.rope_type == "longrope") {
      // Kept as read (Phi3Config wants exactly type, short_factor and long_factor); a new
      // model's original_max_position_embeddings is Phi-3's top-level key.
      if (!o.contains("type") && !o.contains("rope_type")) o["type"] = rs.rope_type;
      o["short_factor"] = rs.short_factor;
      o["long_factor"] = rs.long_factor;
      if (!j.contains("original_max_position_embeddings") &&
          !o.contains("original_max_position_embeddings"))
        j["original_max_position_embeddings"] = rs.original_max_position_embeddings;
    } else {
      o.erase("type");
      o["rope_type"] = rs.rope_type;
      o["factor"] = rs.factor;
    }
    if (rs.rope_type == "llama3") {
      o["low_freq_factor"] = rs.low_freq_factor;
      o["high_freq_factor"] = rs.high_freq_factor;
      o["original_max_position_embeddings"] = rs.original_max_position_embeddings;
    }
    j["rope_scaling"] = o;
  }
  if (c.bos_token_id >= 0)
    j["bos_token_id"] = c.bos_token_id;
  else if (j.contains("bos_token_id"))
    j["bos_token_id"] = nullptr;
  std::vector<int64_t> eos = c.eos_token_ids;
  if (eos.empty() || eos.front() != c.eos_token_id)
    eos = c.eos_token_id >= 0 ? std::vector<int64_t>{c.eos_token_id} : std::vector<int64_t>{};
  if (eos.size() > 1 ||
      (eos.size() == 1 && j.contains("eos_token_id") && j["eos_token_id"].is_array()))
    j["eos_token_id"] = eos;
  else if (eos.size() == 1)
    j["eos_token_id"] = eos.front();
  else if (j.contains("eos_token_id"))
    j["eos_token_id"] = nullptr;
  if (c.sliding_window > 0) j["sliding_window"] = c.sliding_window;
  if (family.reads_softcaps) {
    j["attn_logit_softcapping"] =
        c.attn_logit_softcapping > 0 ? json(c.attn_logit_softcapping) : json(nullptr);
    j["final_logit_softcapping"] =
        c.final_logit_softcapping > 0 ? json(c.final_logit_softcapping) : json(nullptr);
  }
  if (family.reads_query_pre_attn_scalar) j["query_pre_attn_scalar"] = c.query_pre_attn_scalar;
  if (family.default_rope_local_base_freq > 0) j["rope_local_base_freq"] = c.rope_local_base_freq;
  if (j.contains("layer_types") || !c.layer_types.empty()) j["layer_types"] = c.layer_types;
  if (c.num_labels > 0) write_classifier_keys(c, family, j);
  return j;
}

}  // namespace

namespace {

// A multimodal config.json's text_config as written: the keys the text model's json added to
// the block as read are dropped again where reading the block without them gives the same
// model (transformers' defaults), so that a published config.json, whose text_config names only
// what differs from Gemma3TextConfig, saves back as it was.
json minimal_text_block(const ModelConfig& c, json text) {
  auto model_of = [&](const json& block) {
    json outer = c.multimodal;
    outer["text_config"] = block;
    return text_model_config_to_json(parse_model_config(outer, "text_config"), false);
  };
  const json model = model_of(text);
  std::vector<std::string> added;
  for (const auto& [key, value] : text.items())
    if (!c.raw.is_object() || !c.raw.contains(key)) added.push_back(key);
  for (const std::string& key : added) {
    json without = text;
    without.erase(key);
    if (model_of(without) == model) text = std::move(without);
  }
  return text;
}

}  // namespace

json model_config_to_json(const ModelConfig& c) {
  if (!c.multimodal.is_object()) return text_model_config_to_json(c, true);
  // The multimodal file as read, its text_config rewritten; token ids taken from the outer
  // file stay there only.
  json text = text_model_config_to_json(c, false);
  for (const std::string& key : c.ids_from_multimodal) text.erase(key);
  json j = c.multimodal;
  j["text_config"] = minimal_text_block(c, std::move(text));
  return j;
}

ModelConfig load_model_config(const fs::path& dir_or_file) {
  fs::path file = dir_or_file;
  std::error_code ec;
  if (fs::is_directory(dir_or_file, ec)) {
    file = dir_or_file / "config.json";
    FT_CHECK(fs::exists(file, ec), "no config.json in '" + dir_or_file.string() + "'");
  }
  const std::string text = read_file(file);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(file.string() + ": not valid JSON (" + e.what() + ")");
  }
  ModelConfig c = parse_model_config(j, file.string());
  // A multimodal checkpoint's other tensors are this directory's (a save carries them through).
  if (c.multimodal.is_object() && file != dir_or_file)
    c.multimodal_source_dir = dir_or_file.string();
  return c;
}

}  // namespace fusetune
