// Producing a model's parameters one tensor at a time, straight into their final storage:
// the counter-based random init (the same bits for any thread count, normal statistics, BF16
// = the F32 init rounded), sharded bf16 checkpoints written tensor by tensor and loaded into
// BF16 / F32 with a counted peak of the final footprint plus one tensor, QLoRA's base
// quantized to NF4 while it loads (bit for bit today's quantize-after-load, below the float
// model's size), clear errors for a truncated or corrupt shard, and `fusetune init-checkpoint`.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "cli_runner.h"
#include "fusetune/config/config.h"
#include "fusetune/core/memory.h"
#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/io/hf_config.h"
#include "fusetune/models/parameters.h"
#include "fusetune/peft/nf4_weight.h"
#include "fusetune/recipes/recipe_setup.h"
#include "fusetune/util/error.h"
#include "tensor_checks.h"
#include "test_support.h"
#include "tiny_models.h"

using namespace fusetune;
using namespace fusetune::testing;
namespace fs = std::filesystem;

namespace {

// Layers large against the embedding, so one tensor is small next to the whole model.
ModelConfig deep_config(bool tied = false) {
  ModelConfig c = tiny_config(tied, /*qkv_bias=*/false);
  c.vocab_size = 96;
  c.hidden_size = 64;
  c.intermediate_size = 160;
  c.num_hidden_layers = 6;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  return c;
}

std::vector<ParamInfo> params_of(const ModelConfig& c) {
  std::vector<ParamInfo> out;
  for (const auto& [name, shape] : expected_parameters(c)) out.push_back({name, shape, true});
  return out;
}

int64_t total_bytes(const TensorMap& m) {
  int64_t n = 0;
  for (const auto& [name, t] : m) n += int64_t(t.nbytes());
  return n;
}

// Writes a random-init model as bf16 shards of at most `shard_bytes`, tensor by tensor.
void write_random_checkpoint(const fs::path& dir, const ModelConfig& c, uint64_t seed,
                             int64_t shard_bytes, DType dtype = DType::BF16) {
  std::vector<TensorSource> src;
  for (const auto& [name, shape] : expected_parameters(c))
    src.push_back({name, shape, dtype, [name = name, shape = shape, seed, dtype] {
                     Tensor t = Tensor::empty(shape, dtype);
                     init_parameter(name, seed, 0.02, t);
                     return t;
                   }});
  SaveOptions so;
  so.dtype = dtype;
  so.max_shard_bytes = shard_bytes;
  save_hf_checkpoint(dir, c, src, so);
}

int count_shards(const fs::path& dir) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") ++n;
  return n;
}

struct ThreadCount {
  int saved = omp_get_max_threads();
  ~ThreadCount() { omp_set_num_threads(saved); }
};

}  // namespace

TEST(ParamInit, SameBitsForAnyThreadCount) {
  ThreadCount restore;
  // Odd sizes and one larger than a parallel block (2^14 elements).
  const std::vector<ParamInfo> params = {{"model.embed_tokens.weight", {301, 129}, true},
                                         {"a.weight", {7}, true},
                                         {"b.weight", {1}, true},
                                         {"model.norm.weight", {33}, true},
                                         {"x.bias", {5}, true}};
  for (DType dt : {DType::F32, DType::BF16, DType::F64}) {
    omp_set_num_threads(1);
    TensorMap one = init_parameters(params, 7, dt);
    omp_set_num_threads(2);
    TensorMap two = init_parameters(params, 7, dt);
    for (const auto& p : params) EXPECT_TRUE(same_bits(one.at(p.name), two.at(p.name))) << p.name;
  }
  // A parameter's values do not depend on which others exist or their order.
  TensorMap alone = init_parameters({params[1]}, 7, DType::F32);
  TensorMap all = init_parameters(params, 7, DType::F32);
  EXPECT_TRUE(same_bits(alone.at("a.weight"), all.at("a.weight")));
}

TEST(ParamInit, NormalStatisticsAndConstants) {
  const int64_t n = 1 << 20;
  const double std_dev = 0.02;
  TensorMap m = init_parameters({{"w.weight", {n}, true},
                                 {"v.weight", {n}, true},
                                 {"model.layers.0.input_layernorm.weight", {9}, true},
                                 {"q.bias", {9}, true}},
                                3, DType::F64, std_dev);
  const double* w = m.at("w.weight").data<double>();
  const double* v = m.at("v.weight").data<double>();
  double sum = 0, sq = 0, cross = 0, quart = 0;
  int64_t within1 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double z = w[i] / std_dev;
    sum += z;
    sq += z * z;
    quart += z * z * z * z;
    cross += z * v[i] / std_dev;
    within1 += std::abs(z) < 1.0;
  }
  const double mean = sum / n, var = sq / n - mean * mean;
  // 5 standard errors: mean ~ N(0, 1/n), var ~ N(1, 2/n), kurtosis 3 ~ sd sqrt(96/n).
  EXPECT_LT(std::abs(mean), 5 / std::sqrt(double(n)));
  EXPECT_LT(std::abs(var - 1), 5 * std::sqrt(2.0 / n));
  EXPECT_LT(std::abs(quart / n - 3), 5 * std::sqrt(96.0 / n));
  EXPECT_LT(std::abs(double(within1) / n - 0.682689), 5 * std::sqrt(0.2167 / n));
  // Two parameters are independent streams.
  EXPECT_LT(std::abs(cross / n), 5 / std::sqrt(double(n)));
  for (int i = 0; i < 9; ++i) {
    EXPECT_EQ(m.at("model.layers.0.input_layernorm.weight").data<double>()[i], 1.0);
    EXPECT_EQ(m.at("q.bias").data<double>()[i], 0.0);
  }
  // Another seed, other values.
  TensorMap other = init_parameters({{"w.weight", {n}, true}}, 4, DType::F64, std_dev);
  EXPECT_NE(other.at("w.weight").data<double>()[0], w[0]);
}

TEST(ParamInit, NarrowDtypesAreTheWiderInitRounded) {
  const auto params = params_of(deep_config());
  TensorMap f64 = init_parameters(params, 11, DType::F64);
  TensorMap f32 = init_parameters(params, 11, DType::F32);
  TensorMap bf16 = init_parameters(params, 11, DType::BF16);
  for (const auto& p : params) {
    const Tensor &d = f64.at(p.name), &f = f32.at(p.name), &b = bf16.at(p.name);
    ASSERT_EQ(b.dtype(), DType::BF16);
    for (int64_t i = 0; i < d.numel(); ++i) {
      ASSERT_EQ(f.data<float>()[i], float(d.data<double>()[i])) << p.name << " " << i;
      ASSERT_EQ(b.data<uint16_t>()[i], f32_to_bf16(f.data<float>()[i])) << p.name << " " << i;
    }
  }
}

TEST(ParamInit, SinkTakesItsParametersAsF32) {
  struct Collect : ParamSink {
    TensorMap got;
    bool takes(const std::string& name) const override { return name.find("mlp") != name.npos; }
    void put(const std::string& name, const Shape& shape, const ElementSource& values) override {
      Tensor t = Tensor::empty(shape, DType::F32);
      // In two ranges, as a sink asking for pieces would.
      const int64_t n = t.numel(), half = n / 4 * 2;
      values(0, half, t.data<float>());
      values(half, n - half, t.data<float>() + half);
      got[name] = t;
    }
  } sink;
  const auto params = params_of(deep_config());
  TensorMap f32 = init_parameters(params, 5, DType::F32);
  TensorMap rest = init_parameters(params, 5, DType::BF16, 0.02, &sink);
  EXPECT_EQ(sink.got.size() + rest.size(), params.size());
  EXPECT_EQ(sink.got.size(), 3u * 6);
  for (const auto& [name, t] : sink.got) {
    EXPECT_FALSE(rest.count(name));
    EXPECT_TRUE(same_bits(t, f32.at(name))) << name;
  }
}

TEST(ParamStreaming, ShardedBf16CheckpointLoadsIntoBf16AndF32) {
  TempDir tmp;
  const ModelConfig c = deep_config();
  // A layer's MLP matrices are 20 KiB each in bf16: many shards.
  write_random_checkpoint(tmp / "ck", c, 9, 64 << 10);
  ASSERT_TRUE(fs::exists(tmp / "ck" / "model.safetensors.index.json"));
  EXPECT_GE(count_shards(tmp / "ck"), 4);
  const auto params = params_of(c);
  const TensorMap want = init_parameters(params, 9, DType::BF16);
  int64_t largest = 0;
  for (const auto& [name, t] : want) largest = std::max(largest, int64_t(t.nbytes()));

  for (DType dt : {DType::BF16, DType::F32}) {
    const int64_t before = memory::current_bytes();
    memory::reset_peak();
    HFCheckpoint ck = load_hf_checkpoint_owned(tmp / "ck", {}, dt);
    const int64_t peak = memory::peak_bytes() - before;
    TensorMap got(ck.tensors.begin(), ck.tensors.end());
    const int64_t final_bytes = total_bytes(got);
    EXPECT_EQ(memory::current_bytes() - before, final_bytes);  // owned, counted, nothing else
    // The final footprint plus at most one tensor (in the target dtype) and a little slack.
    EXPECT_LE(peak, final_bytes + largest * int64_t(dtype_size(dt)) / 2 + (16 << 10))
        << dtype_name(dt);
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [name, w] : want) {
      const Tensor& t = got.at(name);
      ASSERT_EQ(t.dtype(), dt) << name;
      if (dt == DType::BF16) {
        EXPECT_TRUE(same_bits(t, w)) << name;
      } else {
        for (int64_t i = 0; i < t.numel(); ++i)
          ASSERT_EQ(t.data<float>()[i], bf16_to_f32(w.data<uint16_t>()[i])) << name;
      }
    }
    // The same values as the borrowing loader.
    HFCheckpoint borrowed = load_hf_checkpoint(tmp / "ck", {}, dt);
    for (const auto& [name, t] : borrowed.tensors) EXPECT_TRUE(same_bits(t, got.at(name))) << name;
  }
}

TEST(ParamStreaming, WriterHoldsOneTensorAtATime) {
  TempDir tmp;
  const ModelConfig c = deep_config();
  const auto params = params_of(c);
  int64_t largest = 0, total = 0;
  for (const auto& p : params) {
    largest = std::max(largest, shape_numel(p.shape) * 2);
    total += shape_numel(p.shape) * 2;
  }
  const int64_t before = memory::current_bytes();
  memory::reset_peak();
  write_random_checkpoint(tmp / "ck", c, 1, 100 << 10);
  EXPECT_LE(memory::peak_bytes() - before, largest + (16 << 10));
  EXPECT_LT(largest + (16 << 10), total / 4);  // so the check above means something
}

TEST(ParamStreaming, QLoraBaseQuantizedWhileLoadingEqualsQuantizeAfterLoad) {
  TempDir tmp;
  for (bool tied : {false, true}) {
    const ModelConfig c = deep_config(tied);
    const fs::path dir = tmp / (tied ? "tied" : "untied");
    write_random_checkpoint(dir, c, 21, 48 << 10);

    // Today's way: the whole model in F32, then quantized.
    HFCheckpoint full = load_hf_checkpoint_owned(dir, {}, DType::F32);
    TensorMap params(full.tensors.begin(), full.tensors.end());
    const int64_t full_f32 = total_bytes(params);
    auto after = peft::quantize_base_weights(params, c);

    const int64_t before = memory::current_bytes();
    memory::reset_peak();
    auto sink = std::make_shared<peft::NF4BaseSink>();
    HFCheckpoint streamed = load_hf_checkpoint_owned(dir, {}, DType::F32, sink.get());
    auto store = sink->finish(c);
    const int64_t peak = memory::peak_bytes() - before;
    // Below the bf16 model, let alone the fp32 one.
    EXPECT_LT(peak, full_f32 / 2) << "tied " << tied;

    ASSERT_EQ(store->size(), after->size());
    for (const auto& [name, w] : *after) {
      const peft::NF4Weight& s = store->at(name);
      EXPECT_EQ(s.shape, w.shape) << name;
      EXPECT_TRUE(same_bits(s.codes, w.codes)) << name;
      EXPECT_TRUE(same_bits(s.absmax_codes, w.absmax_codes)) << name;
      EXPECT_TRUE(same_bits(s.absmax_scales, w.absmax_scales)) << name;
      EXPECT_EQ(std::memcmp(&s.offset, &w.offset, sizeof(float)), 0) << name;
    }
    // What stays float is the same too.
    ASSERT_EQ(streamed.tensors.size(), params.size());
    for (const auto& [name, t] : params) EXPECT_TRUE(same_bits(streamed.tensors.at(name), t));
  }
}

TEST(ParamStreaming, QLoraRandomInitThroughLoadModel) {
  const Config cfg = Config::from_string(
      "model:\n  init: random\n  vocab_size: 96\n  hidden_size: 64\n  intermediate_size: 160\n"
      "  num_hidden_layers: 3\n  num_attention_heads: 4\n  num_key_value_heads: 2\n"
      "seed: 17\n",
      "test.yaml");
  LoadedModel plain = load_model(cfg, DType::F32);
  auto after = peft::quantize_base_weights(plain.params, plain.config);
  peft::NF4BaseSink sink;
  LoadedModel streamed = load_model(cfg, DType::F32, &sink);
  auto store = sink.finish(streamed.config);
  ASSERT_EQ(store->size(), after->size());
  for (const auto& [name, w] : *after) {
    EXPECT_TRUE(same_bits(store->at(name).codes, w.codes)) << name;
    EXPECT_TRUE(same_bits(store->at(name).absmax_scales, w.absmax_scales)) << name;
  }
  EXPECT_EQ(streamed.params.size(), plain.params.size());
}

// A random-init Gemma's (1 + w) norms start at w = 0, an effective scale of 1 as transformers
// initializes them (1 would scale by 2); a Llama's plain norms start at 1.
TEST(ParamStreaming, RandomInitGemmaNormsStartAtZeroOthersAtOne) {
  for (const char* type : {"gemma", "gemma2", "llama"}) {
    const Config cfg = Config::from_string(
        std::string("model:\n  init: random\n  model_type: ") + type +
            "\n  vocab_size: 32\n  hidden_size: 16\n  intermediate_size: 24\n"
            "  num_hidden_layers: 2\n  num_attention_heads: 2\n  head_dim: 8\nseed: 3\n",
        "test.yaml");
    const LoadedModel m = load_model(cfg, DType::F32);
    const double want = std::string(type) == "llama" ? 1.0 : 0.0;
    int norms = 0;
    for (const auto& [name, t] : m.params) {
      if (name.find("norm.weight") == std::string::npos) continue;
      ++norms;
      for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(t.data<float>()[i], want) << type << name;
    }
    EXPECT_EQ(norms, std::string(type) == "gemma2" ? 9 : 5) << type;
  }
}

TEST(ParamStreaming, TruncatedOrCorruptShardNamesTheFile) {
  TempDir tmp;
  const ModelConfig c = deep_config();
  write_random_checkpoint(tmp / "ck", c, 2, 64 << 10);
  const int shards = count_shards(tmp / "ck");
  ASSERT_GE(shards, 3);
  char name[64];
  std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", 2, shards);
  const fs::path shard = tmp / "ck" / name;
  const auto size = fs::file_size(shard);
  fs::resize_file(shard, size - 100);
  auto message = [&] {
    try {
      load_hf_checkpoint_owned(tmp / "ck", {}, DType::BF16);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string m = message();
  EXPECT_NE(m.find(shard.string()), std::string::npos) << m;
  EXPECT_NE(m.find("truncated"), std::string::npos) << m;
  // A header length that is garbage.
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    const char garbage[8] = {'\xff', '\xff', '\xff', '\xff', '\xff', '\xff', '\xff', '\x7f'};
    f.write(garbage, 8);
  }
  m = message();
  EXPECT_NE(m.find(shard.string()), std::string::npos) << m;
  // A shard gone.
  fs::remove(shard);
  m = message();
  EXPECT_NE(m.find(name), std::string::npos) << m;
}

TEST(ParamStreaming, InitCheckpointCommand) {
  TempDir tmp;
  const ModelConfig c = deep_config();
  {
    std::ofstream f(tmp / "config.json");
    f << model_config_to_json(c).dump(2);
  }
  const fs::path out = tmp / "out";
  CliResult r =
      run_fusetune("init-checkpoint --config '" + (tmp / "config.json").string() + "' --output '" +
                   out.string() + "' --dtype bf16 --max-shard-size 64KiB --seed 5");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_GE(count_shards(out), 4);
  HFCheckpoint ck = load_hf_checkpoint_owned(out, {}, DType::BF16);
  const TensorMap want = init_parameters(params_of(c), 5, DType::BF16);
  for (const auto& [name, t] : want) EXPECT_TRUE(same_bits(ck.tensors.at(name), t)) << name;

  r = run_fusetune("init-checkpoint --config '" + (tmp / "config.json").string() + "' --dry-run");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("dry run"), std::string::npos) << r.out;
  r = run_fusetune("init-checkpoint --config '" + (tmp / "config.json").string() + "' --output '" +
                   out.string() + "' --max-shard-size 5 elephants");
  EXPECT_NE(r.code, 0);
  r = run_fusetune("init-checkpoint --config '" + (tmp / "config.json").string() + "' --output '" +
                   out.string() + "' --max-shard-size 5XB");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--max-shard-size"), std::string::npos) << r.out;
}
