#include "fusetune/peft/adapter.h"

#include <algorithm>
#include <cmath>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "fusetune/io/safetensors.h"
#include "fusetune/models/model_family.h"
#include "fusetune/util/error.h"
#include "fusetune/util/fs.h"
#include "fusetune/util/strings.h"

namespace fusetune::peft {

namespace fs = std::filesystem;

namespace {

const std::string kPrefix = "base_model.model.";

std::vector<std::string> adapter_names(const LinearSite& s, const LoraConfig& c) {
  std::vector<std::string> n = {s.module + ".lora_A.weight", s.module + ".lora_B.weight"};
  if (c.use_dora) n.push_back(s.module + ".lora_magnitude_vector");
  return n;
}

Shape adapter_shape(const std::string& name, const LinearSite& s, const LoraConfig& c) {
  if (name.find(".lora_A.") != std::string::npos) return {c.rank, s.in};
  if (name.find(".lora_B.") != std::string::npos) return {s.out, c.rank};
  return {s.out};
}

}  // namespace

namespace {

// The key of our adapter tensor `n` in adapter_model.safetensors.
std::string peft_key(const ModelConfig* model, const std::string& n) {
  return kPrefix + (model ? multimodal_module_name(*model, n) : n);
}

// target_modules for a multimodal model's language model: PEFT full-matches a string against
// each module path; the language model's modules only (lm_head may sit at the top).
std::string multimodal_targets(const std::vector<std::string>& names) {
  std::string alt;
  for (const std::string& n : names) alt += (alt.empty() ? "" : "|") + n;
  const bool head = std::find(names.begin(), names.end(), "lm_head") != names.end();
  return ".*language_model.*\\.(" + alt + ")" + (head ? "|lm_head" : "");
}

// The module names of a target_modules string multimodal_targets wrote.
std::vector<std::string> names_of_multimodal_targets(const std::string& s,
                                                     const std::string& where) {
  static const std::regex form(R"(\.\*language_model\.\*\\\.\(([a-z_|]+)\)(\|lm_head)?)");
  std::smatch m;
  FT_CHECK(std::regex_match(s, m, form),
           where + ": target_modules '" + s +
               "' is a pattern fusetune does not read (it reads a list of module names, or the "
               "language-model pattern it writes for a multimodal model)");
  return split(m[1].str(), '|');
}

}  // namespace

void save_peft_adapter(const fs::path& dir, const LoraConfig& c, const TensorMap& params,
                       const std::string& base, const ModelConfig* model) {
  fs::create_directories(dir);
  NamedTensors tensors;
  nlohmann::json j;
  j["peft_type"] = "LORA";
  j["task_type"] = "CAUSAL_LM";
  j["r"] = c.rank;
  j["lora_alpha"] = c.alpha;
  j["lora_dropout"] = c.dropout;
  // Phi-3's adapters sit on its fused projections (qkv_proj, gate_up_proj), as PEFT names them.
  bool fused = false;
  for (const auto& [name, t] : params)
    fused = fused || name.find(".qkv_proj.lora_") != std::string::npos ||
            name.find(".gate_up_proj.lora_") != std::string::npos;
  const bool multimodal = model && !model->multimodal_text_prefix.empty();
  j["target_modules"] = multimodal ? nlohmann::json(multimodal_targets(target_modules(c, fused)))
                                   : nlohmann::json(target_modules(c, fused));
  j["use_dora"] = c.use_dora;
  j["use_rslora"] = false;
  j["bias"] = "none";
  j["fan_in_fan_out"] = false;
  j["inference_mode"] = true;
  j["init_lora_weights"] = true;
  j["modules_to_save"] = nullptr;
  j["base_model_name_or_path"] = base;
  // Sorted (TensorMap is unordered) so the file is byte-identical across runs.
  std::vector<std::string> names;
  for (const auto& [name, t] : params)
    if (is_adapter_param(name)) names.push_back(name);
  std::sort(names.begin(), names.end());
  FT_CHECK(!names.empty(), "save_peft_adapter: no adapter parameters to save");
  // A sequence classifier's head trains in full beside the adapters: saved as PEFT's SEQ_CLS
  // task saves it (modules_to_save: score, the whole tensor under its own name).
  if (model && model->num_labels > 0 && params.count(kScoreWeight)) {
    j["task_type"] = "SEQ_CLS";
    j["modules_to_save"] = nlohmann::json::array({"score"});
    names.push_back(kScoreWeight);
  }
  for (const auto& n : names)
    tensors.push_back({peft_key(model, n), params.at(n).dtype() == DType::F32
                                               ? params.at(n)
                                               : params.at(n).to(DType::F32)});
  save_safetensors(dir / "adapter_model.safetensors", tensors, {{"format", "pt"}});
  write_file_atomic(dir / "adapter_config.json", j.dump(2) + "\n");
}

Adapter load_peft_adapter(const fs::path& dir, const ModelConfig& model) {
  const fs::path cfg_path = dir / "adapter_config.json";
  std::error_code ec;
  FT_CHECK(fs::is_regular_file(cfg_path, ec), "no adapter_config.json in " + dir.string());
  nlohmann::json j = nlohmann::json::parse(read_file(cfg_path), nullptr, false);
  FT_CHECK(!j.is_discarded() && j.is_object(), cfg_path.string() + ": not valid JSON");
  auto need = [&](const char* key) -> const nlohmann::json& {
    FT_CHECK(j.contains(key), cfg_path.string() + ": missing key '" + key + "'");
    return j.at(key);
  };
  Adapter a;
  bool with_score = false;  // modules_to_save: [score]
  try {
    FT_CHECK(need("peft_type").get<std::string>() == "LORA",
             cfg_path.string() + ": peft_type is '" + j.at("peft_type").get<std::string>() +
                 "', expected LORA");
    a.config.rank = need("r").get<int64_t>();
    a.config.alpha = need("lora_alpha").get<double>();
    a.config.dropout = j.value("lora_dropout", 0.0);
    a.config.use_dora = j.value("use_dora", false);
    FT_CHECK(!j.value("use_rslora", false),
             cfg_path.string() + ": use_rslora adapters are not supported");
    FT_CHECK(!j.value("fan_in_fan_out", false),
             cfg_path.string() + ": fan_in_fan_out adapters are not supported");
    for (const char* k : {"rank_pattern", "alpha_pattern"})
      FT_CHECK(!j.contains(k) || j.at(k).is_null() || j.at(k).empty(),
               cfg_path.string() + ": " + k + " is not supported");
    const auto& tm = need("target_modules");
    FT_CHECK(tm.is_array() || (tm.is_string() && !model.multimodal_text_prefix.empty()),
             cfg_path.string() + ": target_modules must be a list of module names");
    set_targets_from_hf(a.config, tm.is_array() ? tm.get<std::vector<std::string>>()
                                                : names_of_multimodal_targets(tm.get<std::string>(),
                                                                              cfg_path.string()));
    if (j.contains("base_model_name_or_path") && j.at("base_model_name_or_path").is_string())
      a.base_model_name_or_path = j.at("base_model_name_or_path").get<std::string>();
    if (j.contains("modules_to_save") && j.at("modules_to_save").is_array())
      for (const auto& m : j.at("modules_to_save")) {
        FT_CHECK(m.is_string() && m.get<std::string>() == "score" && model.num_labels > 0,
                 cfg_path.string() + ": modules_to_save " + j.at("modules_to_save").dump() +
                     " is not supported (only a sequence classifier's `score`)");
        with_score = true;
      }
  } catch (const nlohmann::json::exception& e) {
    throw Error(cfg_path.string() + ": " + e.what());
  }
  FT_CHECK(a.config.rank >= 1, cfg_path.string() + ": r must be >= 1");

  SafetensorsFile st = SafetensorsFile::open(dir / "adapter_model.safetensors");
  std::set<std::string> keys;
  for (const LinearSite& s : lora_sites(model, a.config))
    for (const std::string& n : adapter_names(s, a.config)) {
      const std::string key = peft_key(&model, n);
      keys.insert(key);
      FT_CHECK(st.has(key), st.path() + ": missing tensor '" + key + "'");
      Tensor t = st.tensor(key);
      const Shape want = adapter_shape(n, s, a.config);
      FT_CHECK(t.shape() == want, st.path() + ": tensor '" + key + "' is " + shape_str(t.shape()) +
                                      ", expected " + shape_str(want));
      a.tensors[n] = t.to(DType::F32);
    }
  if (with_score) {
    const std::string key = peft_key(&model, kScoreWeight);
    keys.insert(key);
    FT_CHECK(st.has(key), st.path() + ": missing tensor '" + key + "' (modules_to_save: score)");
    Tensor t = st.tensor(key);
    FT_CHECK(t.shape() == (Shape{model.num_labels, model.hidden_size}),
             st.path() + ": tensor '" + key + "' is " + shape_str(t.shape()) + ", expected " +
                 shape_str(Shape{model.num_labels, model.hidden_size}));
    a.tensors[kScoreWeight] = t.to(DType::F32);
  }
  for (const std::string& n : st.names())
    FT_CHECK(keys.count(n), st.path() + ": unexpected tensor '" + printable(n) +
                                "' (not an adapter of the targeted layers)");
  return a;
}

void merge_adapters(TensorMap& params, const ModelConfig& model, const LoraConfig& c) {
  const double s = c.scale();
  for (const LinearSite& site : lora_sites(model, c)) {
    FT_CHECK(!(site.module == "lm_head" && model.tie_word_embeddings),
             "cannot merge an lm_head adapter into a model with tied embeddings");
    auto wit = params.find(site.weight);
    FT_CHECK(wit != params.end(), "merge: base weight '" + site.weight + "' is missing");
    const Tensor A = params.at(site.module + ".lora_A.weight").to(DType::F64);
    const Tensor B = params.at(site.module + ".lora_B.weight").to(DType::F64);
    Tensor W = wit->second.to(DType::F64);
    const int64_t O = site.out, I = site.in, r = c.rank;
    double* w = W.data<double>();
    const double *a = A.data<double>(), *bm = B.data<double>();
    for (int64_t o = 0; o < O; ++o)
      for (int64_t k = 0; k < r; ++k) {
        const double f = s * bm[o * r + k];
        if (f == 0) continue;
        for (int64_t i = 0; i < I; ++i) w[o * I + i] += f * a[k * I + i];
      }
    if (c.use_dora) {
      const Tensor m = params.at(site.module + ".lora_magnitude_vector").to(DType::F64);
      for (int64_t o = 0; o < O; ++o) {
        double n2 = 0;
        for (int64_t i = 0; i < I; ++i) n2 += w[o * I + i] * w[o * I + i];
        const double f = m.data<double>()[o] / std::max(std::sqrt(n2), 1e-30);
        for (int64_t i = 0; i < I; ++i) w[o * I + i] *= f;
      }
      params.erase(site.module + ".lora_magnitude_vector");
    }
    wit->second = W.to(wit->second.dtype());
    params.erase(site.module + ".lora_A.weight");
    params.erase(site.module + ".lora_B.weight");
  }
}

}  // namespace fusetune::peft
