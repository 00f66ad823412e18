// PEFT adapter directories: the files PEFT reads, save -> load reproduces the logits, merging
// into the base reproduces base + adapter (LoRA and DoRA), `fusetune merge`, bad adapters.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "fusetune/cli/command.h"
#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/io/safetensors.h"
#include "fusetune/models/parameters.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/peft/adapter.h"
#include "fusetune/util/error.h"
#include "fusetune/util/fs.h"
#include "tensor_checks.h"
#include "test_support.h"
#include "tiny_models.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace {

peft::LoraConfig config(bool dora, bool output) {
  peft::LoraConfig c;
  c.attn_modules = {"q_proj", "v_proj", "output_proj"};
  c.apply_to_mlp = true;
  c.apply_to_output = output;
  c.rank = 4;
  c.alpha = 8;
  c.use_dora = dora;
  return c;
}

// A base model plus trained-looking adapters (B != 0).
TensorMap model_with_adapters(const ModelConfig& cfg, const peft::LoraConfig& c) {
  TrainingGraph tg = build_training_graph(cfg, TrainingGraphOptions{});
  TensorMap p = init_parameters(graph_parameters(tg.graph), 3, DType::F32, 0.2);
  peft::init_adapters(p, cfg, c, 4, DType::F32);
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> u(-0.2f, 0.2f);
  for (auto& [n, t] : p)
    if (peft::is_adapter_param(n))
      for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] += u(rng);
  return p;
}

Tensor logits(const ModelConfig& cfg, const LlamaOptions& o, const TensorMap& params) {
  Graph g = build_logits_graph(cfg, 2, 7, DType::F32, o);
  Batch b = random_batch(2, 7, cfg.vocab_size, 4);
  TensorMap in;
  in["tokens"] = ids_tensor(b.tokens, {2, 7});
  in["positions"] = ids_tensor(b.positions, {2, 7});
  return EagerExecutor(g).run(in, params)[0];
}

TensorMap base_only(const TensorMap& p) {
  TensorMap out;
  for (const auto& [n, t] : p)
    if (!peft::is_adapter_param(n)) out[n] = t;
  return out;
}

}  // namespace

TEST(PeftAdapter, FilesAreWhatPeftWrites) {
  TempDir tmp;
  ModelConfig cfg = tiny_config(false, false);
  peft::LoraConfig c = config(true, true);
  c.dropout = 0.05;
  TensorMap p = model_with_adapters(cfg, c);
  peft::save_peft_adapter(tmp.path(), c, p, "meta-llama/Llama-3.2-1B-Instruct");
  auto j = nlohmann::json::parse(read_file(tmp / "adapter_config.json"));
  EXPECT_EQ(j["peft_type"], "LORA");
  EXPECT_EQ(j["task_type"], "CAUSAL_LM");
  EXPECT_EQ(j["r"], 4);
  EXPECT_EQ(j["lora_alpha"], 8.0);
  EXPECT_DOUBLE_EQ(j["lora_dropout"].get<double>(), 0.05);
  EXPECT_EQ(j["bias"], "none");
  EXPECT_EQ(j["use_dora"], true);
  EXPECT_EQ(j["base_model_name_or_path"], "meta-llama/Llama-3.2-1B-Instruct");
  EXPECT_EQ(j["target_modules"],
            (std::vector<std::string>{"q_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                      "down_proj", "lm_head"}));
  SafetensorsFile st = SafetensorsFile::open(tmp / "adapter_model.safetensors");
  EXPECT_TRUE(st.has("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"));
  EXPECT_TRUE(st.has("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"));
  EXPECT_TRUE(st.has("base_model.model.model.layers.0.self_attn.o_proj.lora_magnitude_vector"));
  EXPECT_TRUE(st.has("base_model.model.lm_head.lora_A.weight"));
  EXPECT_FALSE(st.has("base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight"));
  EXPECT_EQ(st.info("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight").shape,
            (Shape{4, cfg.hidden_size}));
  for (const auto& n : st.names()) EXPECT_EQ(n.rfind("base_model.model.", 0), 0u) << n;
  EXPECT_EQ(st.names().size(), size_t(2 * (3 + 3) * 3 + 3));
}

TEST(PeftAdapter, SaveThenLoadReproducesTheLogits) {
  for (bool dora : {false, true}) {
    TempDir tmp;
    ModelConfig cfg = tiny_config(false, true);
    peft::LoraConfig c = config(dora, !dora);
    TensorMap p = model_with_adapters(cfg, c);
    Tensor before = logits(cfg, peft::lora_llama_options(c), p);
    peft::save_peft_adapter(tmp.path(), c, p, "base");
    peft::Adapter a = peft::load_peft_adapter(tmp.path(), cfg);
    EXPECT_EQ(peft::target_modules(a.config), peft::target_modules(c));
    EXPECT_EQ(a.config.rank, c.rank);
    EXPECT_EQ(a.config.use_dora, dora);
    TensorMap q = base_only(p);
    for (auto& [n, t] : a.tensors) q[n] = t;
    EXPECT_EQ(q.size(), p.size());
    Tensor after = logits(cfg, peft::lora_llama_options(a.config), q);
    EXPECT_EQ(max_rel_diff(before, after), 0.0);
  }
}

TEST(PeftAdapter, MergedModelLogitsEqualBasePlusAdapter) {
  for (bool dora : {false, true})
    for (bool tied : {false, true}) {
      ModelConfig cfg = tiny_config(tied, false);
      peft::LoraConfig c = config(dora, !tied);
      TensorMap p = model_with_adapters(cfg, c);
      Tensor with_adapter = logits(cfg, peft::lora_llama_options(c), p);
      Tensor base = logits(cfg, {}, base_only(p));
      TensorMap merged = p;
      peft::merge_adapters(merged, cfg, c);
      for (const auto& [n, t] : merged) EXPECT_FALSE(peft::is_adapter_param(n)) << n;
      Tensor m = logits(cfg, {}, merged);
      EXPECT_LT(max_rel_diff(with_adapter, m), 1e-5) << "dora " << dora << " tied " << tied;
      EXPECT_GT(max_rel_diff(with_adapter, base), 1e-2);  // the adapter does change the model
      // The training map is untouched (merge replaces tensors, it does not write into them).
      EXPECT_EQ(max_rel_diff(logits(cfg, peft::lora_llama_options(c), p), with_adapter), 0.0);
    }
}

TEST(PeftAdapter, MergeCommandWritesAnHfCheckpoint) {
  TempDir tmp;
  ModelConfig cfg = tiny_config(false, false);
  cfg.raw = nlohmann::json::object();
  peft::LoraConfig c = config(false, true);
  TensorMap p = model_with_adapters(cfg, c);
  NamedTensors base;
  for (const auto& [n, shape] : expected_parameters(cfg)) base.push_back({n, p.at(n)});
  save_hf_checkpoint(tmp / "base", cfg, base);
  peft::save_peft_adapter(tmp / "adapter", c, p, (tmp / "base").string());
  EXPECT_EQ(cli::cmd_merge({"--base", (tmp / "base").string(), "--adapter",
                            (tmp / "adapter").string(), "--output", (tmp / "merged").string()}),
            0);
  HFCheckpoint ck = load_hf_checkpoint(tmp / "merged");
  TensorMap merged;
  for (auto& [n, t] : ck.tensors) merged[n] = t;
  Tensor expect = logits(cfg, peft::lora_llama_options(c), p);
  EXPECT_LT(max_rel_diff(expect, logits(ck.config, {}, merged)), 1e-5);
  // Missing arguments and a wrong base are one-line errors.
  EXPECT_THROW(cli::cmd_merge({"--base", (tmp / "base").string()}), Error);
  ModelConfig other = cfg;
  other.hidden_size = 32;
  other.head_dim = 8;
  TrainingGraph tg = build_training_graph(other, TrainingGraphOptions{});
  TensorMap op = init_parameters(graph_parameters(tg.graph), 3, DType::F32);
  NamedTensors ob;
  for (const auto& [n, shape] : expected_parameters(other)) ob.push_back({n, op.at(n)});
  save_hf_checkpoint(tmp / "other", other, ob);
  try {
    cli::cmd_merge({"--base", (tmp / "other").string(), "--adapter", (tmp / "adapter").string(),
                    "--output", (tmp / "merged2").string()});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lora_A.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("expected"), std::string::npos) << e.what();
  }
}

TEST(PeftAdapter, BadAdaptersAreRejectedNamingTheProblem) {
  TempDir tmp;
  ModelConfig cfg = tiny_config(false, false);
  peft::LoraConfig c = config(false, false);
  TensorMap p = model_with_adapters(cfg, c);
  auto expect_error = [&](const std::string& what) {
    try {
      peft::load_peft_adapter(tmp.path(), cfg);
      ADD_FAILURE() << "no error; expected one mentioning " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_error("adapter_config.json");
  peft::save_peft_adapter(tmp.path(), c, p, "base");
  auto j = nlohmann::json::parse(read_file(tmp / "adapter_config.json"));
  auto write = [&](const nlohmann::json& v) {
    write_file_atomic(tmp / "adapter_config.json", v.dump());
  };
  // An adapter saved for k_proj too but missing its tensors.
  auto j2 = j;
  j2["target_modules"].push_back("k_proj");
  write(j2);
  expect_error("k_proj.lora_A.weight");
  j2 = j;
  j2["peft_type"] = "IA3";
  write(j2);
  expect_error("peft_type");
  j2 = j;
  j2["target_modules"] = {"q_proj", "embed_tokens"};
  write(j2);
  expect_error("embed_tokens");
  j2 = j;
  j2.erase("r");
  write(j2);
  expect_error("'r'");
  j2 = j;
  j2["r"] = 2;  // the tensors have rank 4
  write(j2);
  expect_error("expected [2, ");
  write_file_atomic(tmp / "adapter_config.json", "{not json");
  expect_error("not valid JSON");
  write(j);
  // An extra tensor the config does not explain.
  NamedTensors extra;
  SafetensorsFile st = SafetensorsFile::open(tmp / "adapter_model.safetensors");
  for (const auto& n : st.names()) extra.push_back({n, st.tensor(n).clone()});
  extra.push_back({"base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight",
                   Tensor::zeros({4, 16}, DType::F32)});
  save_safetensors(tmp / "adapter_model.safetensors", extra);
  expect_error("unexpected tensor");
  // Merging an lm_head adapter into tied embeddings is refused.
  ModelConfig tied = tiny_config(true, false);
  peft::LoraConfig ch = config(false, true);
  TensorMap tp = model_with_adapters(tied, ch);
  EXPECT_THROW(peft::merge_adapters(tp, tied, ch), Error);
}
