// The recipe paths of the families beside the Llama one that the other recipe tests do not
// already run: a tiny Qwen3 (q/k norms, head_dim apart from hidden_size / heads, tied), Phi-3
// (fused qkv_proj and gate_up_proj, untied), Gemma (GeGLU, (1 + w) norms, MQA), Gemma 2
// (post-norms, soft-caps that bite, a window of 8 on the first layer) and Gemma 3 (q/k norms,
// the local layer on its own RoPE base) through LoRA DPO, full DPO (policy and reference from
// a checkpoint of the family), QAT, QAT + LoRA, QLoRA and DoRA, each in eager and compile: true
// (the same losses), then `fusetune plan` of the run and (full DPO) `fusetune eval` of the saved
// model, compiled as eager; and 2-rank runs (Qwen3: ZeRO-3 full fine-tuning, ZeRO-2 LoRA DPO;
// Phi-3: ZeRO-2 LoRA on the fused projections; Gemma and Gemma 2: ZeRO-3; Gemma 3: QAT at
// ZeRO-1). Each saved checkpoint reads back as the family, with its own tensors.
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>

#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/io/safetensors.h"
#include "metrics_log.h"
#include "recipe_matrix.h"
#include "resume_runs.h"

using namespace fusetune;
using namespace fusetune::testing;
namespace fs = std::filesystem;

namespace {

struct FamilyPath {
  const char* family;  // a model_type
  const char* row;     // a row of recipe_matrix()
};

void PrintTo(const FamilyPath& p, std::ostream* os) { *os << p.family << "_" << p.row; }

const RecipeCase& matrix_row(const std::string& name) {
  for (const RecipeCase& c : recipe_matrix())
    if (c.name == name) return c;
  throw std::runtime_error("no recipe_matrix row " + name);
}

// The family's tiny model as a config.json (the recipe_matrix Llama's sizes: byte vocabulary,
// width 64, so that NF4 and 32-wide quantization groups divide every projection), with each
// family's own options set so that they act on 32-64 token rows.
nlohmann::json family_config(const std::string& family) {
  nlohmann::json c = {{"model_type", family},     {"vocab_size", 259},
                      {"hidden_size", 64},        {"intermediate_size", 128},
                      {"num_hidden_layers", 2},   {"num_attention_heads", 4},
                      {"num_key_value_heads", 2}, {"max_position_embeddings", 128}};
  if (family == "qwen3") {  // head_dim apart from hidden_size / heads (16), tied
    c["head_dim"] = 24;
    c["tie_word_embeddings"] = true;
  } else if (family == "phi3") {
    c["tie_word_embeddings"] = false;
  } else {  // the Gemmas: head_dim 16 (not 256), MQA for Gemma
    c["head_dim"] = 16;
    if (family == "gemma") c["num_key_value_heads"] = 1;
  }
  if (family == "gemma2" || family == "gemma3_text") {  // a window shorter than the rows
    c["sliding_window"] = 8;
    c["layer_types"] = {"sliding_attention", "full_attention"};
  }
  if (family == "gemma2") {  // caps that bend random logits, query_pre_attn_scalar != head_dim
    c["attn_logit_softcapping"] = 2.0;
    c["final_logit_softcapping"] = 3.0;
    c["query_pre_attn_scalar"] = 20;
  }
  if (family == "gemma3_text") c["rope_local_base_freq"] = 100.0;
  return c;
}

// A random checkpoint of the family's model (full DPO's policy and reference).
fs::path write_family_checkpoint(const fs::path& dir, const fs::path& config) {
  const fs::path out = dir / "ckpt";
  const CliRun r = run_shell(shell_quote(binary_path()) + " init-checkpoint --config " +
                                 shell_quote(config.string()) + " --output " +
                                 shell_quote(out.string()) + " --seed 3",
                             dir / "s_init");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  return out;
}

// recipe_matrix's config of the case, with the family's model: random weights from its
// config.json, or (full DPO) a checkpoint of it.
fs::path write_family_run(const RecipeCase& rc, const std::string& family, const fs::path& dir,
                          Overrides& keys) {
  const fs::path arch = dir / "family_config.json";
  write_text(arch, family_config(family).dump());
  const fs::path source = rc.data == TinyData::Text
                              ? std::filesystem::path(source_dir()) / "configs/demo/demo_corpus.txt"
                              : write_tiny_pairs(dir);
  std::string yaml;
  if (rc.model == TinyModel::FromCheckpoint) {
    yaml = tiny_run_yaml(rc.data, source, write_family_checkpoint(dir / "init", arch));
  } else {
    yaml = tiny_run_yaml(rc.data, source);
    const std::string llama = kTinyLlamaYaml;
    yaml.replace(yaml.find(llama), llama.size(), "  config: " + arch.string() + "\n");
  }
  const fs::path config = dir / "config.yaml";
  write_text(config, yaml);
  if (rc.model == TinyModel::Lora) keys = with_keys(keys, kTinyLoraKeys);
  keys = with_keys(keys, rc.extra);
  // The byte tokenizer has no chat tokens: Qwen's ChatML and Phi-3's format would refuse it.
  if (rc.data == TinyData::Pairs) keys["dataset.template"] = "plain";
  return config;
}

// The tensor that only this family has: Qwen3's q/k norm, Phi-3's fused projection.
std::string family_tensor(const std::string& family) {
  if (family == "phi3") return "model.layers.1.self_attn.qkv_proj.weight";
  if (family == "gemma") return "model.layers.1.post_attention_layernorm.weight";
  if (family == "gemma2") return "model.layers.1.post_feedforward_layernorm.weight";
  return "model.layers.1.self_attn.q_norm.weight";  // qwen3, gemma3_text
}

// What a run saved: the full model as the family, or a PEFT adapter on the family's modules.
void expect_family_checkpoint(const fs::path& epoch, const std::string& family, bool lora) {
  if (lora) {
    const SafetensorsFile a = SafetensorsFile::open(epoch / "adapter_model.safetensors");
    const std::string module = family == "phi3" ? "self_attn.qkv_proj" : "self_attn.q_proj";
    bool found = false;
    for (const std::string& n : a.names()) found |= n.find(module + ".lora_A") != std::string::npos;
    EXPECT_TRUE(found) << "no " << module << ".lora_A in " << epoch;
    return;
  }
  const HFCheckpoint ck = load_hf_checkpoint(epoch);
  EXPECT_EQ(ck.config.model_type, family);
  EXPECT_TRUE(ck.tensors.count(family_tensor(family))) << epoch;
}

// `fusetune eval` (perplexity on the demo corpus's first documents) of a saved checkpoint, in
// one compile mode: the perplexity it writes.
double eval_perplexity(const fs::path& checkpoint, const char* compile, const fs::path& dir) {
  const std::string yaml =
      "model:\n  init: checkpoint\ncheckpointer:\n  checkpoint_dir: " + checkpoint.string() +
      "\ntokenizer:\n  _component_: byte\n  max_seq_len: 64\n"
      "task: perplexity\ndataset:\n  _component_: text_completion\n"
      "  source: configs/demo/demo_corpus.txt\nlimit: 6\nbatch_size: 2\n"
      "dtype: fp32\nnum_threads: 1\ncompile: " +
      compile + "\noutput_dir: " + (dir / compile).string() + "\n";
  const fs::path config = dir / "eval.yaml";
  write_text(config, yaml);
  const CliRun r = run_shell(
      shell_quote(binary_path()) + " eval --config " + shell_quote(config.string()), dir / "io");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  if (r.code != 0) return 0;
  return nlohmann::json::parse(read_text(dir / compile / "eval.json")).at("perplexity");
}

class RecipeFamilyPaths : public ::testing::TestWithParam<FamilyPath> {};

TEST_P(RecipeFamilyPaths, TrainsAndSavesTheFamily) {
  const std::string family = GetParam().family;
  const RecipeCase& rc = matrix_row(GetParam().row);
  if (rc.ranks > 1) FT_REQUIRE_MPIRUN();
  const TempDir tmp;
  Overrides keys = {{"max_steps_per_epoch", "3"}};
  const fs::path config = write_family_run(rc, family, tmp.path(), keys);
  // Eager, then (one process) compile: true, which must log the same losses.
  std::vector<const char*> modes = {"false"};
  if (rc.ranks == 1) modes.push_back("true");
  std::vector<double> eager;
  for (const char* mode : modes) {
    SCOPED_TRACE(mode);
    const fs::path out = tmp / (std::string("out_") + mode);
    const Overrides o = with_keys(keys, {{"compile", mode}, {"output_dir", out.string()}});
    const CliRun r = run_recipe(rc.ranks, rc.recipe, config, o, tmp / "io");
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    const std::vector<double> losses = logged_values(out, "loss");
    ASSERT_EQ(losses.size(), 3u) << r.out;
    for (double l : losses) EXPECT_TRUE(std::isfinite(l));
    if (rc.data == TinyData::Pairs) {
      EXPECT_EQ(logged_values(out, "rewards/margins").size(), 3u);
    }
    if (eager.empty()) eager = losses;
    // Full QAT's step 3 follows an update through 4-bit weights: Adam's first steps move each
    // weight by about lr whatever its gradient's size, so an ulp apart in a near-zero gradient
    // moves a weight across a rounding boundary (the Llama of recipe_matrix drifts as much,
    // 5e-5; Phi-3 7e-4). Steps 1 and 2 (the first fake-quantized forward) agree tightly.
    const bool qat_full = rc.extra.count("quantizer._component_") && rc.model == TinyModel::Full;
    for (size_t i = 0; i < losses.size(); ++i)
      EXPECT_NEAR(losses[i], eager[i], (qat_full && i == 2 ? 2e-3 : 1e-5) * std::fabs(eager[i]))
          << "step " << i + 1;
    expect_family_checkpoint(out / "epoch_0", family, rc.model == TinyModel::Lora);
  }
  if (rc.ranks > 1) return;
  // `fusetune plan` of the same run names the family's model.
  std::string plan = run_command(rc.recipe, config.string(), keys);
  plan.replace(plan.find(" run "), 5, " plan ");
  const CliRun p = run_shell(plan, tmp / "plan");
  EXPECT_EQ(p.code, 0) << p.out << p.err;
  EXPECT_NE(p.out.find(": " + family + " model"), std::string::npos) << p.out;
  // The trained model evaluated (full DPO saves it whole): compiled as eager.
  if (rc.model != TinyModel::FromCheckpoint) return;
  const double eager_ppl = eval_perplexity(tmp / "out_false" / "epoch_0", "false", tmp / "eval");
  const double fused_ppl = eval_perplexity(tmp / "out_false" / "epoch_0", "true", tmp / "eval");
  EXPECT_GT(eager_ppl, 1.0);
  EXPECT_NEAR(fused_ppl, eager_ppl, 1e-5 * eager_ppl);
}

// Every family x {LoRA DPO, full DPO, QAT, QAT + LoRA, QLoRA, DoRA} (DoRA on q/v only is refused
// for Phi-3's fused qkv_proj: models_phi3_test), and a 2-rank run or two of each family.
std::vector<FamilyPath> family_paths() {
  std::vector<FamilyPath> out;
  for (const char* family : {"qwen3", "phi3", "gemma", "gemma2", "gemma3_text"})
    for (const char* row :
         {"lora_dpo_fp32", "full_dpo_fp32", "qat_fp32", "qat_lora_fp32", "qlora_fp32", "dora_fp32"})
      if (std::string(family) != "phi3" || std::string(row) != "dora_fp32")
        out.push_back({family, row});
  out.push_back({"qwen3", "full_dist_fp32_zero3"});
  out.push_back({"qwen3", "lora_dpo_dist_fp32_zero2"});
  out.push_back({"phi3", "lora_dist_fp32_zero2"});
  out.push_back({"gemma", "full_dist_fp32_zero3"});
  out.push_back({"gemma2", "full_dist_fp32_zero3"});
  out.push_back({"gemma3_text", "qat_dist_fp32_zero1"});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Family, RecipeFamilyPaths, ::testing::ValuesIn(family_paths()),
                         [](const ::testing::TestParamInfo<FamilyPath>& i) {
                           return std::string(i.param.family) + "_" + i.param.row;
                         });

}  // namespace
