// Phi-3 / Phi-4 (model_type phi3): the fused qkv_proj and gate_up_proj as the checkpoint stores
// them. The model equals a Llama holding the split weights, a checkpoint loads and saves back
// byte for byte, and LoRA on the fused projections is PEFT's (one A, one B with a row block
// per projection), written out here as the formula W + (alpha / r) B A.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include <nlohmann/json.hpp>

#include "fusetune/graph/autodiff.h"
#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/io/hf_config.h"
#include "fusetune/models/parameters.h"
#include "fusetune/models/rope_tables.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/peft/adapter.h"
#include "fusetune/peft/lora.h"
#include "fusetune/util/error.h"
#include "fusetune/util/fs.h"
#include "peft_support.h"
#include "tensor_checks.h"
#include "test_support.h"
#include "tiny_models.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace {

const std::string kLayer0 = "model.layers.0.";

TensorMap phi3_params(const ModelConfig& cfg, DType dt) {
  TrainingGraph tg = build_training_graph(cfg, TrainingGraphOptions{});
  return init_parameters(graph_parameters(tg.graph), 7, dt, 0.3);
}

Tensor logits(const ModelConfig& cfg, const LlamaOptions& o, const TensorMap& params) {
  Graph g = build_logits_graph(cfg, 2, 6, DType::F64, o);
  Batch b = random_batch(2, 6, cfg.vocab_size, 4);
  TensorMap in;
  in["tokens"] = ids_tensor(b.tokens, {2, 6});
  in["positions"] = ids_tensor(b.positions, {2, 6});
  return EagerExecutor(g).run(in, params)[0];
}

// Rows [start, start + n) of a [rows, cols] F64 matrix.
Tensor rows(const Tensor& w, int64_t start, int64_t n) {
  const int64_t cols = w.shape()[1];
  Tensor out = Tensor::empty({n, cols}, DType::F64);
  for (int64_t i = 0; i < n * cols; ++i) out.data<double>()[i] = w.data<double>()[start * cols + i];
  return out;
}

peft::LoraConfig lora(std::vector<std::string> attn) {
  peft::LoraConfig c;
  c.attn_modules = std::move(attn);
  c.apply_to_mlp = true;
  c.rank = 3;
  c.alpha = 6;
  return c;
}

// W + s B A with the rows of B outside `keep` (a [first, count) row range list) taken as 0.
void merge_by_formula(TensorMap& p, const std::string& module, double s,
                      const std::vector<std::pair<int64_t, int64_t>>& keep) {
  Tensor& W = p.at(module + ".weight");
  const Tensor& A = p.at(module + ".lora_A.weight");
  const Tensor& B = p.at(module + ".lora_B.weight");
  const int64_t out = W.shape()[0], in = W.shape()[1], r = A.shape()[0];
  for (int64_t o = 0; o < out; ++o) {
    bool kept = false;
    for (auto [first, count] : keep) kept = kept || (o >= first && o < first + count);
    if (!kept) continue;
    for (int64_t i = 0; i < in; ++i)
      for (int64_t k = 0; k < r; ++k)
        W.data<double>()[o * in + i] +=
            s * B.data<double>()[o * r + k] * A.data<double>()[k * in + i];
  }
}

// A deep copy (Tensor copies share storage).
TensorMap clone(const TensorMap& p) {
  TensorMap out;
  for (const auto& [name, t] : p) out[name] = t.clone();
  return out;
}

TensorMap without_adapters(const TensorMap& p) {
  TensorMap out;
  for (const auto& [name, t] : p)
    if (!peft::is_adapter_param(name)) out[name] = t;
  return out;
}

}  // namespace

TEST(Phi3, StoresTheFusedProjections) {
  const ModelConfig cfg = tiny_phi3_config();
  const int64_t hd = cfg.head_dim, D = cfg.hidden_size, F = cfg.intermediate_size;
  const int64_t qkv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * hd;
  std::map<std::string, Shape> shapes;
  for (const auto& [name, shape] : expected_parameters(cfg)) shapes[name] = shape;
  EXPECT_EQ(shapes.at(kLayer0 + "self_attn.qkv_proj.weight"), (Shape{qkv, D}));
  EXPECT_EQ(shapes.at(kLayer0 + "mlp.gate_up_proj.weight"), (Shape{2 * F, D}));
  EXPECT_EQ(shapes.count(kLayer0 + "self_attn.q_proj.weight"), 0u);
  EXPECT_EQ(shapes.count(kLayer0 + "mlp.gate_proj.weight"), 0u);
  // The graph's parameters are the checkpoint's.
  TrainingGraph tg = build_training_graph(cfg, TrainingGraphOptions{});
  std::map<std::string, Shape> graph;
  for (const ParamInfo& p : graph_parameters(tg.graph)) graph[p.name] = p.shape;
  EXPECT_EQ(graph, shapes);
}

TEST(Phi3, EqualsALlamaHoldingTheSplitWeights) {
  const ModelConfig phi = tiny_phi3_config();
  ModelConfig llama = phi;
  llama.model_type = "llama";
  const int64_t hd = phi.head_dim, H = phi.num_attention_heads, KV = phi.num_key_value_heads;
  const int64_t F = phi.intermediate_size;
  const TensorMap p = phi3_params(phi, DType::F64);
  TensorMap split;
  for (const auto& [key, t] : p) {
    const std::string& name = key;  // a lambda may not capture a structured binding (clang 14)
    const auto at = [&](const char* fused) { return name.find(fused) != std::string::npos; };
    const std::string layer = name.substr(0, name.find("self_attn"));
    if (at("self_attn.qkv_proj")) {
      split[layer + "self_attn.q_proj.weight"] = rows(t, 0, H * hd);
      split[layer + "self_attn.k_proj.weight"] = rows(t, H * hd, KV * hd);
      split[layer + "self_attn.v_proj.weight"] = rows(t, (H + KV) * hd, KV * hd);
    } else if (at("mlp.gate_up_proj")) {
      const std::string l = name.substr(0, name.find("mlp"));
      split[l + "mlp.gate_proj.weight"] = rows(t, 0, F);  // gate rows first
      split[l + "mlp.up_proj.weight"] = rows(t, F, F);
    } else {
      split[name] = t;
    }
  }
  EXPECT_LT(max_abs_diff(logits(phi, {}, p), logits(llama, {}, split)), 1e-12);
}

TEST(Phi3, CheckpointLoadsAndSavesBackByteForByte) {
  TempDir tmp;
  nlohmann::json j = {{"model_type", "phi3"},
                      {"architectures", {"Phi3ForCausalLM"}},
                      {"vocab_size", 64},
                      {"hidden_size", 16},
                      {"intermediate_size", 24},
                      {"num_hidden_layers", 2},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},
                      {"rms_norm_eps", 1e-5},
                      {"sliding_window", 2047},
                      {"original_max_position_embeddings", 4096},
                      {"resid_pdrop", 0.0},
                      {"bos_token_id", 1},
                      {"eos_token_id", 32000},
                      {"pad_token_id", 32000}};
  const ModelConfig cfg = parse_model_config(j, "config.json");
  NamedTensors tensors;
  const TensorMap p = phi3_params(cfg, DType::F32);
  for (const auto& [name, shape] : expected_parameters(cfg)) tensors.push_back({name, p.at(name)});
  save_hf_checkpoint(tmp / "a", cfg, tensors);
  HFCheckpoint a = load_hf_checkpoint(tmp / "a");
  NamedTensors again;
  for (const auto& [name, shape] : expected_parameters(a.config))
    again.push_back({name, a.tensors.at(name)});
  save_hf_checkpoint(tmp / "b", a.config, again);
  EXPECT_EQ(read_file(tmp / "a" / "model.safetensors"), read_file(tmp / "b" / "model.safetensors"));
  EXPECT_EQ(read_file(tmp / "a" / "config.json"), read_file(tmp / "b" / "config.json"));
  const nlohmann::json saved = nlohmann::json::parse(read_file(tmp / "b" / "config.json"));
  EXPECT_EQ(saved["original_max_position_embeddings"], 4096);
  EXPECT_EQ(saved["sliding_window"], 2047);
  EXPECT_EQ(a.config.eos_token_id, 32000);
}

// PEFT's LoRA on qkv_proj: lora_A [r, hidden], lora_B [(H + 2 KV) hd, r]; the model with the
// adapters is the model with W + s B A.
TEST(Phi3Lora, QkvAndGateUpAdaptersArePeftsOneAAndOneB) {
  const ModelConfig cfg = tiny_phi3_config();
  const int64_t hd = cfg.head_dim, D = cfg.hidden_size, F = cfg.intermediate_size;
  const int64_t qkv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * hd;
  const peft::LoraConfig c = lora({"q_proj", "k_proj", "v_proj", "output_proj"});
  EXPECT_EQ(peft::target_modules(c, true),
            (std::vector<std::string>{"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}));
  TensorMap p = phi3_params(cfg, DType::F64);
  peft::init_adapters(p, cfg, c, 3, DType::F64);
  EXPECT_EQ(p.at(kLayer0 + "self_attn.qkv_proj.lora_A.weight").shape(), (Shape{3, D}));
  EXPECT_EQ(p.at(kLayer0 + "self_attn.qkv_proj.lora_B.weight").shape(), (Shape{qkv, 3}));
  EXPECT_EQ(p.at(kLayer0 + "mlp.gate_up_proj.lora_B.weight").shape(), (Shape{2 * F, 3}));
  EXPECT_EQ(p.count(kLayer0 + "self_attn.q_proj.lora_A.weight"), 0u);
  perturb_adapters(p, 5);
  const Tensor adapted = logits(cfg, peft::lora_llama_options(c), p);
  TensorMap merged = clone(p);
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l)
    for (const char* m :
         {"self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"}) {
      const std::string module = "model.layers." + std::to_string(l) + "." + m;
      merge_by_formula(merged, module, c.scale(), {{0, merged.at(module + ".weight").shape()[0]}});
    }
  EXPECT_LT(max_abs_diff(adapted, logits(cfg, {}, without_adapters(merged))), 1e-12);
  // merge_adapters is the same formula.
  TensorMap by_merge = clone(p);
  peft::merge_adapters(by_merge, cfg, c);
  EXPECT_LT(max_abs_diff(adapted, logits(cfg, {}, by_merge)), 1e-12);
}

// torchtune's phi3 configs target q_proj and v_proj only: the adapter on qkv_proj keeps the k
// rows of B at 0 (no effect, no gradient), and saves and loads in PEFT's names.
TEST(Phi3Lora, OnlyQAndVKeepTheKRowsOfBAtZeroAndSaveInPeftNames) {
  const ModelConfig cfg = tiny_phi3_config();
  const int64_t hd = cfg.head_dim, H = cfg.num_attention_heads, KV = cfg.num_key_value_heads;
  const peft::LoraConfig c = lora({"q_proj", "v_proj", "output_proj"});
  TensorMap p = phi3_params(cfg, DType::F64);
  peft::init_adapters(p, cfg, c, 3, DType::F64);
  perturb_adapters(p, 5);  // k rows of B nonzero too: the mask must hide them
  TensorMap merged = clone(p);
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string layer = "model.layers." + std::to_string(l) + ".";
    merge_by_formula(merged, layer + "self_attn.qkv_proj", c.scale(),
                     {{0, H * hd}, {(H + KV) * hd, KV * hd}});
    merge_by_formula(merged, layer + "self_attn.o_proj", c.scale(), {{0, cfg.hidden_size}});
    merge_by_formula(merged, layer + "mlp.gate_up_proj", c.scale(),
                     {{0, 2 * cfg.intermediate_size}});
    merge_by_formula(merged, layer + "mlp.down_proj", c.scale(), {{0, cfg.hidden_size}});
  }
  const LlamaOptions hooks = peft::lora_llama_options(c);
  EXPECT_LT(max_abs_diff(logits(cfg, hooks, p), logits(cfg, {}, without_adapters(merged))), 1e-12);

  // The k rows of B get no gradient; the q and v rows do.
  Graph g(DType::F64);
  Builder b(g);
  LlamaInputs in;
  in.tokens = g.input("tokens", {2, 6}, DType::I32);
  in.positions = g.input("positions", {2, 6}, DType::I32);
  LlamaOutputs m = build_llama(
      b, cfg, in, [](const std::string& n) { return peft::is_adapter_param(n); }, hooks);
  Value loss = b.sum(b.matmul(m.hidden, m.lm_head, false, true));
  g.mark_output("loss", loss);
  const auto grads = append_backward(g, loss);
  for (const auto& [name, v] : grads) g.mark_output("grad:" + name, v);
  Batch batch = random_batch(2, 6, cfg.vocab_size, 4);
  TensorMap inputs{{"tokens", ids_tensor(batch.tokens, {2, 6})},
                   {"positions", ids_tensor(batch.positions, {2, 6})}};
  const auto out = EagerExecutor(g).run(inputs, p);
  const std::string bname = "grad:" + kLayer0 + "self_attn.qkv_proj.lora_B.weight";
  bool found = false;
  for (size_t k = 0; k < out.size(); ++k) {
    if (g.outputs()[k].first != bname) continue;
    found = true;
    const Tensor& dB = out[k];
    double k_rows = 0, qv_rows = 0;
    for (int64_t r = 0; r < dB.shape()[0]; ++r)
      for (int64_t j = 0; j < c.rank; ++j) {
        const double v = std::abs(dB.data<double>()[r * c.rank + j]);
        (r >= H * hd && r < (H + KV) * hd ? k_rows : qv_rows) += v;
      }
    EXPECT_EQ(k_rows, 0.0);
    EXPECT_GT(qv_rows, 0.0);
  }
  EXPECT_TRUE(found);

  // Saved as PEFT names it: one adapter on qkv_proj; loads back bit for bit.
  TempDir tmp;
  TensorMap f32;
  for (const auto& [name, t] : p)
    if (peft::is_adapter_param(name)) f32[name] = t.to(DType::F32);
  peft::save_peft_adapter(tmp / "adapter", c, f32, "phi3");
  const nlohmann::json j =
      nlohmann::json::parse(read_file(tmp / "adapter" / "adapter_config.json"));
  EXPECT_EQ(j["target_modules"],
            nlohmann::json({"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}));
  const peft::Adapter a = peft::load_peft_adapter(tmp / "adapter", cfg);
  EXPECT_EQ(a.tensors.size(), f32.size());
  for (const auto& [name, t] : f32) EXPECT_EQ(max_abs_diff(a.tensors.at(name), t), 0.0) << name;
  EXPECT_EQ(peft::target_modules(a.config, true), peft::target_modules(c, true));
}

TEST(Phi3Lora, DoraOnOnlySomeOfQkvIsRefused) {
  const ModelConfig cfg = tiny_phi3_config();
  peft::LoraConfig c = lora({"q_proj", "v_proj"});
  c.use_dora = true;
  TensorMap p = phi3_params(cfg, DType::F64);
  peft::init_adapters(p, cfg, c, 3, DType::F64);
  try {
    logits(cfg, peft::lora_llama_options(c), p);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DoRA on only some of q_proj, k_proj, v_proj"),
              std::string::npos)
        << e.what();
  }
}

namespace {

nlohmann::json longrope_config() {
  return {{"model_type", "phi3"},
          {"vocab_size", 64},
          {"hidden_size", 16},
          {"intermediate_size", 24},
          {"num_hidden_layers", 1},
          {"num_attention_heads", 4},  // head_dim 4: two frequencies
          {"max_position_embeddings", 32},
          {"original_max_position_embeddings", 8},
          {"rope_theta", 100.0},
          {"rope_scaling",
           {{"type", "longrope"}, {"short_factor", {1.5, 3.0}}, {"long_factor", {4.0, 9.0}}}}};
}

}  // namespace

// Phi-3's 128k RoPE: inv_freq_i = 1 / (ext_i * theta^(2i / head_dim)), ext the short factors up
// to original_max_position_embeddings positions and the long ones past it, and cos and sin
// times sqrt(1 + ln(max_pos / orig) / ln(orig)).
TEST(Phi3LongRope, TablesFollowTheFormula) {
  const ModelConfig cfg = parse_model_config(longrope_config(), "config.json");
  EXPECT_EQ(cfg.rope_scaling.rope_type, "longrope");
  EXPECT_EQ(cfg.rope_scaling.original_max_position_embeddings, 8);
  const double attention = std::sqrt(1 + std::log(32.0 / 8.0) / std::log(8.0));
  EXPECT_DOUBLE_EQ(cfg.rope_scaling.attention_factor, attention);
  const double theta = 100.0, hd = 4.0;
  for (int64_t n : {6, 8, 12}) {  // 6 and 8 positions: short factors; 12: long
    const std::vector<double> ext =
        n > 8 ? std::vector<double>{4.0, 9.0} : std::vector<double>{1.5, 3.0};
    auto [cos, sin] = rope_tables(cfg, n, DType::F64);
    ASSERT_EQ(cos.shape(), (Shape{n, 2}));
    for (int64_t p = 0; p < n; ++p)
      for (int64_t i = 0; i < 2; ++i) {
        const double inv = 1.0 / (ext[size_t(i)] * std::pow(theta, 2.0 * double(i) / hd));
        EXPECT_NEAR(cos.data<double>()[p * 2 + i], std::cos(double(p) * inv) * attention, 1e-15);
        EXPECT_NEAR(sin.data<double>()[p * 2 + i], std::sin(double(p) * inv) * attention, 1e-15);
      }
  }
}

TEST(Phi3LongRope, ConfigSavesAsReadAndBadFactorsAreRefused) {
  nlohmann::json j = longrope_config();
  const ModelConfig cfg = parse_model_config(j, "config.json");
  const nlohmann::json back = model_config_to_json(cfg);
  EXPECT_EQ(back["rope_scaling"], j["rope_scaling"]);  // Phi3Config wants these three keys
  EXPECT_EQ(back["original_max_position_embeddings"], 8);
  // A factor apiece for each of head_dim / 2 frequencies.
  j["rope_scaling"]["long_factor"] = {4.0};
  try {
    parse_model_config(j, "config.json");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("need head_dim / 2 = 2 entries each, got 2 and 1"),
              std::string::npos)
        << e.what();
  }
  // A new model keeps Phi-3's layout too.
  ModelConfig fresh = cfg;
  fresh.raw = nlohmann::json();
  const nlohmann::json written = model_config_to_json(fresh);
  EXPECT_EQ(written["rope_scaling"]["type"], "longrope");
  EXPECT_EQ(written["original_max_position_embeddings"], 8);
  const ModelConfig again = parse_model_config(written, "written.json");
  EXPECT_EQ(again.rope_scaling.long_factor, cfg.rope_scaling.long_factor);
  EXPECT_DOUBLE_EQ(again.rope_scaling.attention_factor, cfg.rope_scaling.attention_factor);
}
