// io/hf_checkpoint: expected parameter names, load/save round trips (dtypes, shards), every
// inconsistency between config.json, index and files, and atomic publication on failure.
#include "files.h"
#include "fusetune/io/hf_checkpoint.h"

#include <sys/resource.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fusetune/io/hf_config.h"
#include "fusetune/util/error.h"
#include "fusetune/util/fs.h"
#include "test_support.h"

namespace fs = std::filesystem;
using fusetune::testing::sorted_entries;
using fusetune::testing::TempDir;
using nlohmann::json;

namespace fusetune {
namespace {

ModelConfig tiny_config(const std::string& type = "llama", bool tied = false) {
  json j = {{"model_type", type},       {"vocab_size", 16},
            {"hidden_size", 8},         {"intermediate_size", 12},
            {"num_hidden_layers", 2},   {"num_attention_heads", 2},
            {"num_key_value_heads", 1}, {"tie_word_embeddings", tied},
            {"rms_norm_eps", 1e-5}};
  return parse_model_config(j);
}

// Deterministic, distinct values per tensor; exactly representable in bf16 when `bf16_exact`.
NamedTensors make_tensors(const ModelConfig& c, bool bf16_exact = false) {
  NamedTensors out;
  int k = 0;
  for (const auto& [name, shape] : expected_parameters(c)) {
    Tensor t = Tensor::empty(shape, DType::F32);
    for (int64_t i = 0; i < t.numel(); ++i) {
      float v = float((i * 37 + k * 11) % 97) / 97.0f - 0.5f;
      if (!bf16_exact) v += 1e-4f * float(i % 7);
      t.data<float>()[i] = bf16_exact ? bf16_to_f32(f32_to_bf16(v)) : v;
    }
    out.push_back({name, t});
    ++k;
  }
  return out;
}

SaveOptions with_dtype(DType t) {
  SaveOptions o;
  o.dtype = t;
  return o;
}
SaveOptions with_shard_limit(int64_t bytes) {
  SaveOptions o;
  o.max_shard_bytes = bytes;
  return o;
}
SaveOptions with_copy_from(const fs::path& dir) {
  SaveOptions o;
  o.copy_files_from = dir;
  return o;
}

void write_config(const fs::path& dir, const ModelConfig& c) {
  fs::create_directories(dir);
  write_file_atomic(dir / "config.json", model_config_to_json(c).dump(2));
}

void expect_same_values(const HFCheckpoint& ck, const NamedTensors& want, double tol = 0) {
  ASSERT_EQ(ck.tensors.size(), want.size());
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(ck.tensors.count(name)) << name;
    const Tensor& got = ck.tensors.at(name);
    ASSERT_EQ(got.shape(), t.shape()) << name;
    for (int64_t i = 0; i < t.numel(); ++i)
      ASSERT_NEAR(element_as_double(got, i), element_as_double(t, i), tol)
          << name << "[" << i << "]";
  }
}

// Expects loading `dir` to fail with a one-line message containing every needle.
void expect_checkpoint_error(const fs::path& dir, std::initializer_list<std::string> needles,
                             const std::vector<std::string>& files = {}) {
  try {
    load_hf_checkpoint(dir, files);
    ADD_FAILURE() << "expected an error loading " << dir;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << msg;
  }
}

TEST(IoHfCheckpoint, ExpectedParametersInHfOrder) {
  ModelConfig c = tiny_config();
  auto p = expected_parameters(c);
  ASSERT_EQ(p.size(), 1 + 2 * 9 + 2u);
  EXPECT_EQ(p[0].first, "model.embed_tokens.weight");
  EXPECT_EQ(p[0].second, (Shape{16, 8}));
  EXPECT_EQ(p[1].first, "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(p[2].first, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(p[2].second, (Shape{8, 8}));
  EXPECT_EQ(p[3].first, "model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(p[3].second, (Shape{4, 8}));  // 1 kv head * head_dim 4
  EXPECT_EQ(p[5].first, "model.layers.0.self_attn.o_proj.weight");
  EXPECT_EQ(p[9].first, "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(p[9].second, (Shape{8, 12}));
  EXPECT_EQ(p[p.size() - 2].first, "model.norm.weight");
  EXPECT_EQ(p.back().first, "lm_head.weight");

  EXPECT_EQ(expected_parameters(tiny_config("llama", true)).size(), p.size() - 1);
  auto q = expected_parameters(tiny_config("qwen2"));
  ASSERT_EQ(q.size(), p.size() + 2 * 3);
  EXPECT_EQ(q[3].first, "model.layers.0.self_attn.q_proj.bias");
  EXPECT_EQ(q[3].second, (Shape{8}));
  EXPECT_EQ(q[5].first, "model.layers.0.self_attn.k_proj.bias");
  EXPECT_EQ(q[5].second, (Shape{4}));
}

TEST(IoHfCheckpoint, SaveLoadRoundTripF32) {
  TempDir tmp;
  ModelConfig c = tiny_config("qwen2");
  NamedTensors t = make_tensors(c);
  save_hf_checkpoint(tmp / "ck", c, t);
  EXPECT_EQ(sorted_entries(tmp / "ck"),
            (std::vector<std::string>{"config.json", "model.safetensors"}));
  HFCheckpoint ck = load_hf_checkpoint(tmp / "ck");
  expect_same_values(ck, t);
  EXPECT_TRUE(ck.config.attention_bias);
  EXPECT_EQ(ck.config.num_key_value_heads, 1);
  EXPECT_EQ(ck.source_file.at("model.norm.weight"), (tmp / "ck" / "model.safetensors").string());
  auto f = SafetensorsFile::open(tmp / "ck" / "model.safetensors");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.names().front(), "model.embed_tokens.weight");  // given order kept
  json cfg = json::parse(read_file(tmp / "ck" / "config.json"));
  EXPECT_EQ(cfg["torch_dtype"], "float32");
}

TEST(IoHfCheckpoint, Bf16AndF16Conversions) {
  TempDir tmp;
  ModelConfig c = tiny_config();
  // Save as BF16: values exactly representable come back exactly.
  NamedTensors exact = make_tensors(c, /*bf16_exact=*/true);
  save_hf_checkpoint(tmp / "bf", c, exact, with_dtype(DType::BF16));
  EXPECT_EQ(SafetensorsFile::open(tmp / "bf" / "model.safetensors").info("lm_head.weight").dtype,
            DType::BF16);
  EXPECT_EQ(json::parse(read_file(tmp / "bf" / "config.json"))["torch_dtype"], "bfloat16");
  HFCheckpoint ck = load_hf_checkpoint(tmp / "bf");
  EXPECT_EQ(ck.tensors.at("lm_head.weight").dtype(), DType::F32);
  expect_same_values(ck, exact);

  // General values: BF16 rounding (8 bits of mantissa) stays within relative 2^-8.
  NamedTensors t = make_tensors(c);
  save_hf_checkpoint(tmp / "bf2", c, t, with_dtype(DType::BF16));
  expect_same_values(load_hf_checkpoint(tmp / "bf2"), t, 0.5 / 256);

  // F32 file loaded as BF16 / F16 targets.
  save_hf_checkpoint(tmp / "f32", c, t);
  HFCheckpoint as_bf16 = load_hf_checkpoint(tmp / "f32", {}, DType::BF16);
  EXPECT_EQ(as_bf16.tensors.at("model.norm.weight").dtype(), DType::BF16);
  expect_same_values(as_bf16, t, 0.5 / 256);
  HFCheckpoint as_f16 = load_hf_checkpoint(tmp / "f32", {}, DType::F16);
  EXPECT_EQ(as_f16.tensors.at("model.norm.weight").dtype(), DType::F16);
  expect_same_values(as_f16, t, 0.5 / 1024);

  // F16 on disk back to F32.
  save_hf_checkpoint(tmp / "f16", c, t, with_dtype(DType::F16));
  expect_same_values(load_hf_checkpoint(tmp / "f16"), t, 0.5 / 1024);

  EXPECT_THROW(load_hf_checkpoint(tmp / "f32", {}, DType::I32), Error);
}

TEST(IoHfCheckpoint, ShardedSaveAndLoad) {
  TempDir tmp;
  ModelConfig c = tiny_config();
  NamedTensors t = make_tensors(c);
  save_hf_checkpoint(tmp / "ck", c, t, with_shard_limit(1024));
  auto files = sorted_entries(tmp / "ck");
  ASSERT_GT(files.size(), 3u);
  const size_t n_shards = files.size() - 2;  // minus config.json and the index
  char last[64];
  std::snprintf(last, sizeof last, "model-%05zu-of-%05zu.safetensors", n_shards, n_shards);
  EXPECT_EQ(files[0], "config.json");
  EXPECT_EQ(files[1], "model-00001-of-" + std::string(last).substr(15));
  EXPECT_EQ(files[n_shards], last);
  EXPECT_EQ(files.back(), "model.safetensors.index.json");

  json index = json::parse(read_file(tmp / "ck" / "model.safetensors.index.json"));
  int64_t total = 0;
  for (const auto& [name, tensor] : t) total += tensor.nbytes();
  EXPECT_EQ(index["metadata"]["total_size"], total);
  EXPECT_EQ(index["weight_map"].size(), t.size());
  EXPECT_EQ(index["weight_map"]["model.embed_tokens.weight"],
            "model-00001-of-" + std::string(last).substr(15));
  // Every shard respects the limit unless it holds a single oversize tensor.
  for (size_t s = 1; s <= n_shards; ++s) {
    auto f = SafetensorsFile::open(tmp / "ck" / files[s]);
    uint64_t bytes = 0;
    for (const auto& name : f.names()) bytes += f.info(name).end - f.info(name).begin;
    EXPECT_TRUE(bytes <= 1024 || f.names().size() == 1) << files[s];
  }
  expect_same_values(load_hf_checkpoint(tmp / "ck"), t);
  // Explicit file list instead of the index.
  std::vector<std::string> shard_files(files.begin() + 1, files.begin() + 1 + n_shards);
  expect_same_values(load_hf_checkpoint(tmp / "ck", shard_files), t);
}

TEST(IoHfCheckpoint, IndexInconsistencies) {
  TempDir tmp;
  ModelConfig c = tiny_config();
  NamedTensors t = make_tensors(c);
  save_hf_checkpoint(tmp / "ck", c, t, with_shard_limit(1024));
  const fs::path idx = tmp / "ck" / "model.safetensors.index.json";
  const json good = json::parse(read_file(idx));

  json bad = good;
  bad["weight_map"]["model.norm.weight"] = "model-00099-of-00099.safetensors";
  write_file_atomic(idx, bad.dump());
  expect_checkpoint_error(tmp / "ck", {"model-00099-of-00099.safetensors", "does not exist"});

  bad = good;
  const std::string first = good["weight_map"]["model.embed_tokens.weight"];
  const std::string other = good["weight_map"]["lm_head.weight"];
  ASSERT_NE(first, other);
  bad["weight_map"]["lm_head.weight"] = first;  // claims the wrong shard
  write_file_atomic(idx, bad.dump());
  expect_checkpoint_error(tmp / "ck", {"'lm_head.weight'", first, "no such tensor"});

  bad = good;
  bad["weight_map"]["model.norm.weight"] = "../evil.safetensors";
  write_file_atomic(idx, bad.dump());
  expect_checkpoint_error(tmp / "ck", {"not a plain file name"});

  write_file_atomic(idx, "{\"weight_map\": 3}");
  expect_checkpoint_error(tmp / "ck", {"weight_map"});
  write_file_atomic(idx, "{not json");
  expect_checkpoint_error(tmp / "ck", {"model.safetensors.index.json", "not valid JSON"});
}

TEST(IoHfCheckpoint, WrongShapeMissingAndUnexpectedTensors) {
  TempDir tmp;
  ModelConfig c = tiny_config();
  NamedTensors t = make_tensors(c);
  const fs::path dir = tmp / "ck";
  write_config(dir, c);

  NamedTensors wrong = t;
  for (auto& [name, tensor] : wrong)
    if (name == "model.layers.0.self_attn.k_proj.weight")
      tensor = Tensor::zeros({8, 8}, DType::F32);
  save_safetensors(dir / "model.safetensors", wrong);
  expect_checkpoint_error(dir,
                          {"tensor 'model.layers.0.self_attn.k_proj.weight' in",
                           "model.safetensors has shape [8, 8] but config.json implies [4, 8]"});

  NamedTensors missing(t.begin(), t.end() - 1);  // no lm_head
  fs::remove(dir / "model.safetensors");
  save_safetensors(dir / "model.safetensors", missing);
  expect_checkpoint_error(dir, {"missing tensor 'lm_head.weight'", "[16, 8]"});

  NamedTensors extra = t;
  extra.push_back({"model.layers.2.mlp.up_proj.weight", Tensor::zeros({12, 8}, DType::F32)});
  fs::remove(dir / "model.safetensors");
  save_safetensors(dir / "model.safetensors", extra);
  expect_checkpoint_error(
      dir, {"unexpected tensor 'model.layers.2.mlp.up_proj.weight'", "num_hidden_layers = 2"});

  NamedTensors bias = t;
  bias.push_back({"model.layers.0.self_attn.q_proj.bias", Tensor::zeros({8}, DType::F32)});
  fs::remove(dir / "model.safetensors");
  save_safetensors(dir / "model.safetensors", bias);
  expect_checkpoint_error(dir, {"unexpected tensor 'model.layers.0.self_attn.q_proj.bias'"});

  NamedTensors ints = t;
  ints[1].second = Tensor::zeros({8}, DType::I32);
  fs::remove(dir / "model.safetensors");
  save_safetensors(dir / "model.safetensors", ints);
  expect_checkpoint_error(dir, {"has dtype I32"});

  // The same tensor in two explicit files.
  fs::remove(dir / "model.safetensors");
  save_safetensors(dir / "a.safetensors", t);
  save_safetensors(dir / "b.safetensors", {t[0]});
  expect_checkpoint_error(dir, {"'model.embed_tokens.weight' is in both"},
                          {"a.safetensors", "b.safetensors"});
  expect_checkpoint_error(dir, {"nope.safetensors", "does not exist"}, {"nope.safetensors"});
}

TEST(IoHfCheckpoint, TiedModelDropsStoredLmHeadAndIgnoresInvFreq) {
  TempDir tmp;
  ModelConfig c = tiny_config("llama", /*tied=*/true);
  NamedTensors t = make_tensors(c);
  NamedTensors stored = t;
  stored.push_back({"lm_head.weight", Tensor::zeros({16, 8}, DType::F32)});
  stored.push_back(
      {"model.layers.0.self_attn.rotary_emb.inv_freq", Tensor::zeros({2}, DType::F32)});
  write_config(tmp / "ck", c);
  save_safetensors(tmp / "ck" / "model.safetensors", stored);
  HFCheckpoint ck = load_hf_checkpoint(tmp / "ck");
  expect_same_values(ck, t);
  EXPECT_FALSE(ck.tensors.count("lm_head.weight"));
}

TEST(IoHfCheckpoint, MissingFilesAndDirectories) {
  TempDir tmp;
  expect_checkpoint_error(tmp / "nope", {"does not exist"});
  fs::create_directories(tmp / "empty");
  expect_checkpoint_error(tmp / "empty", {"no config.json"});
  write_config(tmp / "noweights", tiny_config());
  write_file_atomic(tmp / "noweights" / "pytorch_model.bin", "pickle");
  expect_checkpoint_error(tmp / "noweights", {"neither model.safetensors", "never loads pickle"});
  // A truncated weights file fails at open, naming the file.
  save_hf_checkpoint(tmp / "ck", tiny_config(), make_tensors(tiny_config()));
  std::string bytes = read_file(tmp / "ck" / "model.safetensors");
  write_file_atomic(tmp / "ck" / "model.safetensors", bytes.substr(0, bytes.size() / 2));
  expect_checkpoint_error(tmp / "ck", {"model.safetensors", "truncated"});
}

TEST(IoHfCheckpoint, SaveValidatesTensorsAndCopiesSideFiles) {
  TempDir tmp;
  ModelConfig c = tiny_config();
  NamedTensors t = make_tensors(c);
  NamedTensors short_list(t.begin() + 1, t.end());
  EXPECT_THROW(save_hf_checkpoint(tmp / "a", c, short_list), Error);
  NamedTensors bad_shape = t;
  bad_shape[0].second = Tensor::zeros({16, 9}, DType::F32);
  EXPECT_THROW(save_hf_checkpoint(tmp / "a", c, bad_shape), Error);
  EXPECT_FALSE(fs::exists(tmp / "a"));

  fs::create_directories(tmp / "src");
  write_file_atomic(tmp / "src" / "tokenizer.json", "{\"model\": {}}");
  write_file_atomic(tmp / "src" / "generation_config.json", "{}");
  write_file_atomic(tmp / "src" / "unrelated.txt", "no");
  save_hf_checkpoint(tmp / "a", c, t, with_copy_from(tmp / "src"));
  EXPECT_EQ(sorted_entries(tmp / "a"),
            (std::vector<std::string>{"config.json", "generation_config.json", "model.safetensors",
                                      "tokenizer.json"}));
  EXPECT_EQ(read_file(tmp / "a" / "tokenizer.json"), "{\"model\": {}}");

  // Never replace a directory that is not a checkpoint.
  fs::create_directories(tmp / "precious");
  write_file_atomic(tmp / "precious" / "notes.txt", "keep me");
  EXPECT_THROW(save_hf_checkpoint(tmp / "precious", c, t), Error);
  EXPECT_EQ(read_file(tmp / "precious" / "notes.txt"), "keep me");
}

TEST(IoHfCheckpoint, SaveReplacesOldCheckpointWholly) {
  TempDir tmp;
  ModelConfig c = tiny_config();
  NamedTensors t = make_tensors(c);
  save_hf_checkpoint(tmp / "ck", c, t, with_shard_limit(1024));  // sharded
  NamedTensors t2 = make_tensors(c, true);
  save_hf_checkpoint(tmp / "ck", c, t2);  // single file: old shards and index must be gone
  EXPECT_EQ(sorted_entries(tmp / "ck"),
            (std::vector<std::string>{"config.json", "model.safetensors"}));
  expect_same_values(load_hf_checkpoint(tmp / "ck"), t2);
  EXPECT_EQ(sorted_entries(tmp.path()), std::vector<std::string>{"ck"});

  // Save over the directory the tensors are still mapped from (load, edit, save in place).
  HFCheckpoint ck = load_hf_checkpoint(tmp / "ck");
  NamedTensors again;
  for (const auto& [name, shape] : expected_parameters(c))
    again.push_back({name, ck.tensors.at(name)});
  again[0].second.data<float>()[0] = 7.0f;  // copy-on-write: the file on disk is not touched
  save_hf_checkpoint(tmp / "ck", c, again, with_shard_limit(1024));
  NamedTensors expect = t2;
  expect[0].second = expect[0].second.clone();
  expect[0].second.data<float>()[0] = 7.0f;
  expect_same_values(load_hf_checkpoint(tmp / "ck"), expect);
  expect_same_values(ck, expect);  // the old mapping stays valid after the swap
}

// A shard write fails midway (file size limit -> EFBIG). The previous checkpoint must stay
// intact and loadable, and no other directory may appear beside it.
TEST(IoHfCheckpoint, FailedShardWriteKeepsPreviousCheckpoint) {
  TempDir tmp;
  ModelConfig c = tiny_config();
  c.vocab_size = 1024;  // embed and lm_head: 32 KiB each in F32; everything else is small
  NamedTensors old_t = make_tensors(c, true);
  save_hf_checkpoint(tmp / "ck", c, old_t);
  const std::string old_bytes = read_file(tmp / "ck" / "model.safetensors");

  NamedTensors new_t = make_tensors(c);
  // Move embed_tokens to the end, so small shards are written before the big one fails.
  std::rotate(new_t.begin(), new_t.begin() + 1, new_t.end());
  struct rlimit old_lim {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_lim), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old_lim;
  lim.rlim_cur = 16 * 1024;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
  std::string msg;
  try {
    save_hf_checkpoint(tmp / "ck", c, new_t, with_shard_limit(2048));
  } catch (const Error& e) {
    msg = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old_lim);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_NE(msg.find("cannot write"), std::string::npos) << msg;

  EXPECT_EQ(sorted_entries(tmp.path()), std::vector<std::string>{"ck"});
  EXPECT_EQ(sorted_entries(tmp / "ck"),
            (std::vector<std::string>{"config.json", "model.safetensors"}));
  EXPECT_EQ(read_file(tmp / "ck" / "model.safetensors"), old_bytes);
  expect_same_values(load_hf_checkpoint(tmp / "ck"), old_t);

  // First save into a fresh directory failing late (a side file that is a directory):
  // nothing appears under the final name.
  fs::create_directories(tmp / "src" / "tokenizer.json");
  EXPECT_THROW(save_hf_checkpoint(tmp / "fresh", c, new_t, with_copy_from(tmp / "src")), Error);
  EXPECT_EQ(sorted_entries(tmp.path()), (std::vector<std::string>{"ck", "src"}));
  // And replacing an existing checkpoint with the same late failure keeps the old one.
  EXPECT_THROW(save_hf_checkpoint(tmp / "ck", c, new_t, with_copy_from(tmp / "src")), Error);
  EXPECT_EQ(read_file(tmp / "ck" / "model.safetensors"), old_bytes);
  EXPECT_EQ(sorted_entries(tmp.path()), (std::vector<std::string>{"ck", "src"}));
}

}  // namespace
}  // namespace fusetune
