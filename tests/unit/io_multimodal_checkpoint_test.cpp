// Gemma 3 checkpoints saved as Gemma3ForConditionalGeneration (config.json's model_type gemma3
// with the text model under text_config; the text model's tensors under language_model.model.
// and language_model.lm_head, or, as later transformers save them, model.language_model. and a
// top-level lm_head; the vision tower's and projector's beside them): fusetune loads the text
// model, and a save writes it back under the names it came with, the other tensors carried
// through byte for byte, so that load -> save reproduces the checkpoint.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include <nlohmann/json.hpp>

#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/io/hf_config.h"
#include "fusetune/io/safetensors.h"
#include "fusetune/util/error.h"
#include "fusetune/util/fs.h"
#include "recipe_runs.h"
#include "test_support.h"

using namespace fusetune;
using namespace fusetune::testing;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A tiny Gemma 3 text model (untied, so that lm_head is stored too) as the published
// checkpoints' text_config has it: only what differs from Gemma3TextConfig's defaults (here
// the sizes, the window and the 4B's linear RoPE scaling), no token ids of its own.
json mm_text_config(int64_t vocab = 40) {
  return json{
      {"model_type", "gemma3_text"}, {"vocab_size", vocab},
      {"hidden_size", 16},           {"intermediate_size", 24},
      {"num_hidden_layers", 2},      {"num_attention_heads", 4},
      {"num_key_value_heads", 2},    {"head_dim", 8},
      {"sliding_window", 4},         {"rope_scaling", {{"factor", 8.0}, {"rope_type", "linear"}}},
      {"tie_word_embeddings", false}};
}

json mm_config(int64_t vocab = 40) {
  return json{{"architectures", {"Gemma3ForConditionalGeneration"}},
              {"model_type", "gemma3"},
              {"boi_token_index", 37},
              {"eoi_token_index", 38},
              {"image_token_index", 39},
              {"mm_tokens_per_image", 4},
              {"bos_token_id", 2},
              {"eos_token_id", {1, 36}},
              {"text_config", mm_text_config(vocab)},
              {"vision_config",
               {{"model_type", "siglip_vision_model"}, {"hidden_size", 8}, {"patch_size", 2}}},
              {"torch_dtype", "bfloat16"}};
}

Tensor random_tensor(const Shape& shape, DType dt, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 0.5f);
  Tensor t = Tensor::empty(shape, DType::F32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = n(rng);
  return dt == DType::F32 ? t : t.to(dt);
}

// The vision tower's and projector's tensors: not the text model's, one of them F32 in a BF16
// file (a save in BF16 must not convert it).
NamedTensors vision_tensors() {
  return {
      {"multi_modal_projector.mm_input_projection_weight", random_tensor({8, 16}, DType::BF16, 1)},
      {"multi_modal_projector.mm_soft_emb_norm.weight", random_tensor({8}, DType::BF16, 2)},
      {"vision_tower.vision_model.embeddings.patch_embedding.weight",
       random_tensor({8, 3, 2, 2}, DType::F32, 3)},
      {"vision_tower.vision_model.post_layernorm.weight", random_tensor({8}, DType::BF16, 4)}};
}

// Writes the multimodal checkpoint: the text model's tensors (BF16) under `model_prefix` and
// `lm_head`, then the vision tensors. Returns the text model's tensors by their text names.
std::map<std::string, Tensor> write_mm_checkpoint(const fs::path& dir,
                                                  const std::string& model_prefix,
                                                  const std::string& lm_head, int64_t vocab = 40) {
  fs::create_directories(dir);
  FileWriter w(dir / "config.json");
  w.write(mm_config(vocab).dump(2) + "\n");
  w.close();
  const ModelConfig text = parse_model_config(mm_text_config(vocab), "text");
  NamedTensors stored;
  std::map<std::string, Tensor> by_text_name;
  uint32_t seed = 10;
  for (const auto& [name, shape] : expected_parameters(text)) {
    const Tensor t = random_tensor(shape, DType::BF16, seed++);
    by_text_name[name] = t;
    stored.push_back(
        {name == "lm_head.weight" ? lm_head : model_prefix + name.substr(6), t});  // "model."
  }
  for (const auto& v : vision_tensors()) stored.push_back(v);
  save_safetensors(dir / "model.safetensors", stored, {{"format", "pt"}});
  return by_text_name;
}

std::string bytes_of(const Tensor& t) {
  return std::string(static_cast<const char*>(t.raw()), t.nbytes());
}

// Every tensor of `a` is in `b` with the same dtype, shape and bytes, and `b` has no other.
void expect_same_tensors(const fs::path& a, const fs::path& b) {
  const SafetensorsFile fa = SafetensorsFile::open(a), fb = SafetensorsFile::open(b);
  ASSERT_EQ(fa.names(), fb.names());
  for (const std::string& name : fa.names()) {
    const Tensor ta = fa.tensor(name), tb = fb.tensor(name);
    EXPECT_EQ(ta.dtype(), tb.dtype()) << name;
    EXPECT_EQ(ta.shape(), tb.shape()) << name;
    EXPECT_TRUE(bytes_of(ta) == bytes_of(tb)) << name;
  }
}

NamedTensors loaded_tensors(const HFCheckpoint& ck) {
  NamedTensors out;
  for (const auto& [name, shape] : expected_parameters(ck.config))
    out.push_back({name, ck.tensors.at(name)});
  return out;
}

struct MmLayout {
  const char* model_prefix;
  const char* lm_head;
};

TEST(MultimodalCheckpoint, Gemma3TextModelLoadsAndSavesBackBitwiseInEitherLayout) {
  for (const MmLayout layout : {MmLayout{"language_model.model.", "language_model.lm_head.weight"},
                                MmLayout{"model.language_model.", "lm_head.weight"}}) {
    SCOPED_TRACE(layout.model_prefix);
    const TempDir tmp;
    const auto text = write_mm_checkpoint(tmp / "src", layout.model_prefix, layout.lm_head);
    const HFCheckpoint ck = load_hf_checkpoint(tmp / "src");
    // The text model, with the outer file's token ids (its text_config has none).
    EXPECT_EQ(ck.config.model_type, "gemma3_text");
    EXPECT_EQ(ck.config.hidden_size, 16);
    EXPECT_EQ(ck.config.head_dim, 8);
    EXPECT_EQ(ck.config.eos_token_ids, (std::vector<int64_t>{1, 36}));
    EXPECT_EQ(ck.config.bos_token_id, 2);
    ASSERT_EQ(ck.tensors.size(), text.size());  // no vision tensor among them
    for (const auto& [name, t] : text) {
      ASSERT_TRUE(ck.tensors.count(name)) << name;
      EXPECT_TRUE(bytes_of(ck.tensors.at(name).to(DType::BF16)) == bytes_of(t)) << name;
    }
    // Saved (BF16, as stored): the same tensors under the same names, the vision ones as they
    // were (the F32 one still F32), and the same config.json.
    SaveOptions bf16;
    bf16.dtype = DType::BF16;
    save_hf_checkpoint(tmp / "a", ck.config, loaded_tensors(ck), bf16);
    expect_same_tensors(tmp / "src" / "model.safetensors", tmp / "a" / "model.safetensors");
    EXPECT_EQ(read_file(tmp / "a" / "config.json"), read_file(tmp / "src" / "config.json"));
    // And again from the saved one: the files repeat byte for byte.
    const HFCheckpoint again = load_hf_checkpoint(tmp / "a");
    save_hf_checkpoint(tmp / "b", again.config, loaded_tensors(again), bf16);
    for (const char* f : {"model.safetensors", "config.json"})
      EXPECT_TRUE(read_file(tmp / "a" / f) == read_file(tmp / "b" / f)) << f;
  }
}

// A trained model is saved with its new text weights; the vision tensors stay the source's.
TEST(MultimodalCheckpoint, ChangedTextWeightsAreSavedAndTheVisionTensorsKept) {
  const TempDir tmp;
  write_mm_checkpoint(tmp / "src", "language_model.model.", "language_model.lm_head.weight");
  HFCheckpoint ck = load_hf_checkpoint(tmp / "src");
  NamedTensors changed = loaded_tensors(ck);
  for (auto& [name, t] : changed) t = random_tensor(t.shape(), DType::F32, 99);
  save_hf_checkpoint(tmp / "out", ck.config, changed);  // F32
  const SafetensorsFile out = SafetensorsFile::open(tmp / "out" / "model.safetensors");
  const Tensor embed = out.tensor("language_model.model.embed_tokens.weight");
  EXPECT_EQ(embed.dtype(), DType::F32);
  EXPECT_TRUE(bytes_of(embed) == bytes_of(random_tensor(embed.shape(), DType::F32, 99)));
  for (const auto& [name, t] : vision_tensors()) {
    ASSERT_EQ(out.tensor(name).dtype(), t.dtype()) << name;  // BF16 stays BF16 in an F32 save
    EXPECT_TRUE(bytes_of(out.tensor(name)) == bytes_of(t)) << name;
  }
}

// The user's path: a recipe fine-tunes the text model of a multimodal checkpoint (byte
// vocabulary) and its epoch_0 is that checkpoint again, trained: the same layout and config,
// the vision tensors byte for byte, the text ones moved.
TEST(MultimodalCheckpoint, ARecipeTrainsTheTextModelAndSavesTheMultimodalCheckpoint) {
  const TempDir tmp;
  write_mm_checkpoint(tmp / "src", "language_model.model.", "language_model.lm_head.weight", 259);
  const fs::path config = tmp / "run.yaml";
  FileWriter w(config);
  w.write(
      "output_dir: " + (tmp / "out").string() +
      "\nmodel:\n  init: checkpoint\ncheckpointer:\n  checkpoint_dir: " + (tmp / "src").string() +
      "\n  checkpoint_files: [model.safetensors]\ntokenizer:\n  _component_: byte\n"
      "  max_seq_len: 32\ndataset:\n  _component_: text_completion\n  source: "
      "configs/demo/demo_corpus.txt\n  packed: true\nbatch_size: 2\nepochs: 1\n"
      "max_steps_per_epoch: 2\noptimizer:\n  _component_: AdamW\n  lr: 1e-2\n"
      "dtype: bf16\ncompile: true\nnum_threads: 1\n");
  w.close();
  const std::string cli = shell_quote(binary_path()) + " run ";
  const CliRun r = run_shell(
      cli + "full_finetune_single_device --config " + shell_quote(config.string()), tmp / "io");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("its 4 other tensors (vision tower, projector) are not"), std::string::npos)
      << r.err;
  const fs::path epoch = tmp / "out" / "epoch_0";
  const json saved = json::parse(read_file(epoch / "config.json"));
  EXPECT_EQ(saved["model_type"], "gemma3");
  EXPECT_EQ(saved["text_config"], mm_config(259)["text_config"]);
  const SafetensorsFile src = SafetensorsFile::open(tmp / "src" / "model.safetensors"),
                        out = SafetensorsFile::open(epoch / "model.safetensors");
  ASSERT_EQ(src.names(), out.names());
  for (const auto& [name, t] : vision_tensors())
    EXPECT_TRUE(bytes_of(out.tensor(name)) == bytes_of(src.tensor(name))) << name;
  const std::string embed = "language_model.model.embed_tokens.weight";
  EXPECT_EQ(out.tensor(embed).dtype(), DType::BF16);
  EXPECT_FALSE(bytes_of(out.tensor(embed)) == bytes_of(src.tensor(embed)));  // trained
  // LoRA: the merged checkpoint in the multimodal layout, and the adapter as PEFT names it on
  // Gemma3ForConditionalGeneration (module paths under language_model, target_modules a
  // pattern that leaves the vision tower's q_proj/v_proj alone), which `fusetune merge` reads
  // back onto the multimodal base.
  const CliRun lora =
      run_shell(cli + "lora_finetune_single_device --config " + shell_quote(config.string()) +
                    " output_dir=" + shell_quote((tmp / "lora").string()) +
                    " model.lora_attn_modules=[q_proj,v_proj]",
                tmp / "io_lora");
  ASSERT_EQ(lora.code, 0) << lora.out << lora.err;
  const fs::path adapter_dir = tmp / "lora" / "epoch_0";
  EXPECT_EQ(SafetensorsFile::open(adapter_dir / "model.safetensors").names(), src.names());
  const SafetensorsFile adapter = SafetensorsFile::open(adapter_dir / "adapter_model.safetensors");
  EXPECT_EQ(adapter.names().front(),
            "base_model.model.language_model.model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(json::parse(read_file(adapter_dir / "adapter_config.json"))["target_modules"],
            ".*language_model.*\\.(q_proj|v_proj)");
  const CliRun merge = run_shell(shell_quote(binary_path()) + " merge --base " +
                                     shell_quote((tmp / "src").string()) + " --adapter " +
                                     shell_quote(adapter_dir.string()) + " --output " +
                                     shell_quote((tmp / "merged").string()),
                                 tmp / "io_merge");
  ASSERT_EQ(merge.code, 0) << merge.out << merge.err;
  const SafetensorsFile merged = SafetensorsFile::open(tmp / "merged" / "model.safetensors");
  ASSERT_EQ(merged.names(), src.names());
  for (const auto& [name, t] : vision_tensors())
    EXPECT_TRUE(bytes_of(merged.tensor(name)) == bytes_of(src.tensor(name))) << name;
  const std::string q = "language_model.model.layers.0.self_attn.q_proj.weight";
  const Tensor merged_q = merged.tensor(q).to(DType::F32), src_q = src.tensor(q).to(DType::F32),
               recipe_q = SafetensorsFile::open(adapter_dir / "model.safetensors")
                              .tensor(q)
                              .to(DType::F32);
  double moved = 0, apart = 0;  // the adapter's W + s B A, as the recipe merged it (bf16)
  for (int64_t i = 0; i < src_q.numel(); ++i) {
    moved = std::max(moved, double(std::fabs(merged_q.data<float>()[i] - src_q.data<float>()[i])));
    apart =
        std::max(apart, double(std::fabs(merged_q.data<float>()[i] - recipe_q.data<float>()[i])));
  }
  EXPECT_GT(moved, 1e-3);
  EXPECT_LT(apart, 0.02 * moved + 1e-2);
}

// Without a checkpoint to take the vision tensors from (a model built from the config.json file
// alone), a save writes the text model by itself, as Gemma3ForCausalLM with its own token ids.
TEST(MultimodalCheckpoint, WithoutASourceCheckpointTheTextModelIsSavedAlone) {
  const TempDir tmp;
  write_mm_checkpoint(tmp / "src", "language_model.model.", "language_model.lm_head.weight");
  const ModelConfig c = load_model_config(tmp / "src" / "config.json");
  ASSERT_TRUE(c.multimodal_source_dir.empty());
  NamedTensors ts;
  for (const auto& [name, shape] : expected_parameters(c))
    ts.push_back({name, random_tensor(shape, DType::F32, 5)});
  save_hf_checkpoint(tmp / "text", c, ts);
  const json saved = json::parse(read_file(tmp / "text" / "config.json"));
  EXPECT_EQ(saved["model_type"], "gemma3_text");
  EXPECT_EQ(saved["architectures"], json::array({"Gemma3ForCausalLM"}));
  EXPECT_EQ(saved["eos_token_id"], json::array({1, 36}));
  EXPECT_FALSE(saved.contains("text_config"));
  const HFCheckpoint back = load_hf_checkpoint(tmp / "text");
  EXPECT_TRUE(back.config.multimodal.is_null());
  EXPECT_TRUE(back.tensors.count("model.layers.1.self_attn.q_norm.weight"));
  // From the directory, the same config knows its source and keeps the layout.
  EXPECT_EQ(load_model_config(tmp / "src").multimodal_source_dir, (tmp / "src").string());
}

// transformers fills what a text_config leaves out from Gemma3TextConfig (the published 4B's
// names neither heads nor vocabulary); a missing or foreign text_config is refused by name.
TEST(MultimodalCheckpoint, TextConfigDefaultsAndBadConfigs) {
  const ModelConfig c = parse_model_config(json{{"model_type", "gemma3"},
                                                {"text_config",
                                                 {{"hidden_size", 2560},
                                                  {"intermediate_size", 10240},
                                                  {"num_hidden_layers", 34},
                                                  {"model_type", "gemma3_text"},
                                                  {"sliding_window", 1024}}}},
                                           "config.json");
  EXPECT_EQ(c.model_type, "gemma3_text");
  EXPECT_EQ(c.vocab_size, 262208);
  EXPECT_EQ(c.num_attention_heads, 8);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.layer_types.size(), 34u);
  auto error_of = [](const json& j) {
    try {
      parse_model_config(j, "config.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of(json{{"model_type", "gemma3"}}).find("needs a 'text_config' object"),
            std::string::npos);
  EXPECT_NE(error_of(json{{"model_type", "gemma3"}, {"text_config", {{"model_type", "llama"}}}})
                .find("text_config's model_type must be 'gemma3_text'"),
            std::string::npos);
}

}  // namespace
