// GGUF export: the file layout read back by an independent reader, llama.cpp's tensor names,
// types and q/k row order (checked against RoPE itself), the tokenizer metadata, `fusetune
// quantize`'s weights equal to the GGUF's dequantized tensors, and clear errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "checks.h"
#include "cli_runner.h"
#include "fusetune/io/gguf_export.h"
#include "fusetune/io/gguf_writer.h"
#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/kernels/cpu/ggml_quant.h"
#include "fusetune/util/error.h"
#include "gguf_reader.h"
#include "test_support.h"

using namespace fusetune;
using namespace fusetune::gguf;
using fusetune::testing::contains;
using fusetune::testing::read_gguf;
using nlohmann::json;

namespace {

ModelConfig small_config(bool tied) {
  ModelConfig c;
  c.vocab_size = 40;
  c.hidden_size = 32;
  c.intermediate_size = 48;  // ffn_down's rows (48) are not a multiple of 32: F16 fallback
  c.num_hidden_layers = 1;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 128;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000;
  c.tie_word_embeddings = tied;
  c.bos_token_id = 1;
  c.eos_token_id = 2;
  return c;
}

// A Llama-2-style tokenizer.json: <unk> <s> </s>, two byte pieces, letters, and merges.
json spm_tokenizer_json() {
  json vocab = {{"<unk>", 0},
                {"<s>", 1},
                {"</s>", 2},
                {"<0x00>", 3},
                {"<0x01>", 4},
                {"\xE2\x96\x81", 5},
                {"a", 6},
                {"b", 7},
                {"ab", 8},
                {"\xE2\x96\x81"
                 "ab",
                 9}};
  json added = json::array();
  for (int i = 0; i < 3; ++i)
    added.push_back({{"id", i},
                     {"content", i == 0   ? "<unk>"
                                 : i == 1 ? "<s>"
                                          : "</s>"},
                     {"special", true}});
  return {{"model",
           {{"type", "BPE"},
            {"byte_fallback", true},
            {"unk_token", "<unk>"},
            {"vocab", vocab},
            {"merges", {"a b", "\xE2\x96\x81 ab"}}}},
          {"normalizer",
           {{"type", "Sequence"},
            {"normalizers", {{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}}}}}},
          {"pre_tokenizer", nullptr},
          {"added_tokens", added}};
}

void write_checkpoint(const std::filesystem::path& dir, const ModelConfig& c,
                      const json& tokenizer) {
  std::mt19937 rng(5);
  std::normal_distribution<float> n(0.0f, 0.3f);
  NamedTensors ts;
  for (const auto& [name, shape] : expected_parameters(c)) {
    Tensor t = Tensor::empty(shape, DType::F32);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = n(rng);
    ts.push_back({name, t});
  }
  save_hf_checkpoint(dir, c, ts);
  std::ofstream(dir / "tokenizer.json") << tokenizer.dump();
  std::ofstream(dir / "tokenizer_config.json") << json{{"add_bos_token", true}}.dump();
}

std::vector<float> tensor_values(const HFCheckpoint& ck, const std::string& name) {
  const Tensor& t = ck.tensors.at(name);
  return {t.data<float>(), t.data<float>() + t.numel()};
}

// HF's rotate-half RoPE on one head vector: pairs (i, i + d/2) rotated by pos * theta_i.
std::vector<double> rope_rotate_half(const std::vector<double>& x, int pos) {
  const size_t d = x.size(), h = d / 2;
  std::vector<double> y(d);
  for (size_t i = 0; i < h; ++i) {
    const double a = pos * std::pow(10000.0, -2.0 * double(i) / double(d));
    y[i] = x[i] * std::cos(a) - x[i + h] * std::sin(a);
    y[i + h] = x[i + h] * std::cos(a) + x[i] * std::sin(a);
  }
  return y;
}
// llama.cpp's "normal" RoPE: adjacent pairs (2i, 2i + 1) rotated by pos * theta_i.
std::vector<double> rope_interleaved(const std::vector<double>& x, int pos) {
  const size_t d = x.size();
  std::vector<double> y(d);
  for (size_t i = 0; i < d / 2; ++i) {
    const double a = pos * std::pow(10000.0, -2.0 * double(i) / double(d));
    y[2 * i] = x[2 * i] * std::cos(a) - x[2 * i + 1] * std::sin(a);
    y[2 * i + 1] = x[2 * i + 1] * std::cos(a) + x[2 * i] * std::sin(a);
  }
  return y;
}

}  // namespace

TEST(IoGguf, WriterLayoutReadBack) {
  fusetune::testing::TempDir dir;
  Writer w;
  w.add_string("general.architecture", "llama");
  w.add_u32("llama.block_count", 7);
  w.add_f32("llama.rope.freq_base", 500000.0f);
  w.add_bool("tokenizer.ggml.add_bos_token", true);
  w.add_strings("tokenizer.ggml.tokens", {"a", "", "\xE2\x96\x81x"});
  w.add_f32s("tokenizer.ggml.scores", {0.0f, -1.5f});
  w.add_i32s("tokenizer.ggml.token_type", {1, -3});
  const std::vector<float> vals = {1, 2, 3};
  w.add_tensor({"a", {3}, gguf::TensorType::F32, [&] {
                  std::vector<uint8_t> b(12);
                  std::memcpy(b.data(), vals.data(), 12);
                  return b;
                }});
  w.add_tensor({"b", {2, 32}, gguf::TensorType::Q8_0, [] { return std::vector<uint8_t>(68, 7); }});
  w.write(dir / "x.gguf");
  const auto f = read_gguf(dir / "x.gguf");
  EXPECT_EQ(f.version, 3u);
  EXPECT_EQ(f.kv.size(), 8u);  // with general.alignment
  EXPECT_EQ(f.kv.at("general.alignment"), 32);
  EXPECT_EQ(f.kv_type.at("general.alignment"), 4u);  // UINT32
  EXPECT_EQ(f.kv.at("general.architecture"), "llama");
  EXPECT_EQ(f.kv.at("llama.block_count"), 7);
  EXPECT_EQ(f.kv_type.at("llama.rope.freq_base"), 6u);  // FLOAT32
  EXPECT_EQ(f.kv.at("llama.rope.freq_base"), 500000.0);
  EXPECT_EQ(f.kv.at("tokenizer.ggml.add_bos_token"), true);
  EXPECT_EQ(f.kv.at("tokenizer.ggml.tokens"), json({"a", "", "\xE2\x96\x81x"}));
  EXPECT_EQ(f.kv.at("tokenizer.ggml.scores"), json({0.0, -1.5}));
  EXPECT_EQ(f.kv.at("tokenizer.ggml.token_type"), json({1, -3}));
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(f.tensors[1].ne, (std::vector<uint64_t>{32, 2}));  // innermost first
  EXPECT_EQ(f.tensors[1].type, 8u);
  EXPECT_EQ(f.tensors[0].offset, 0u);
  EXPECT_EQ(f.tensors[1].offset, 32u);  // 12 bytes padded to the alignment
  EXPECT_EQ(f.data_start % 32, 0u);
  float back[3];
  std::memcpy(back, f.data("a"), 12);
  EXPECT_EQ(back[2], 3.0f);
  EXPECT_EQ(f.data("b")[67], 7);
  EXPECT_EQ(f.bytes.size(), f.data_start + 32 + 96);  // 68 bytes padded to 96
}

TEST(IoGguf, WriterRejectsBadInputAndLeavesNoFile) {
  fusetune::testing::TempDir dir;
  Writer w;
  EXPECT_THROW(w.add_tensor({"q", {2, 40}, gguf::TensorType::Q4_0, nullptr}), Error);
  w.add_u32("k", 1);
  EXPECT_THROW(w.add_u32("k", 2), Error);
  w.add_tensor({"t", {4}, gguf::TensorType::F32, [] { return std::vector<uint8_t>(3); }});
  try {
    w.write(dir / "y.gguf");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("produced 3 bytes, expected 16"), std::string::npos);
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));  // the temp file is gone too
}

TEST(IoGguf, TensorNamesAsLlamaCpp) {
  EXPECT_EQ(gguf_tensor_name("model.embed_tokens.weight"), "token_embd.weight");
  EXPECT_EQ(gguf_tensor_name("model.norm.weight"), "output_norm.weight");
  EXPECT_EQ(gguf_tensor_name("lm_head.weight"), "output.weight");
  EXPECT_EQ(gguf_tensor_name("model.layers.12.input_layernorm.weight"), "blk.12.attn_norm.weight");
  EXPECT_EQ(gguf_tensor_name("model.layers.0.self_attn.q_proj.weight"), "blk.0.attn_q.weight");
  EXPECT_EQ(gguf_tensor_name("model.layers.0.self_attn.k_proj.bias"), "blk.0.attn_k.bias");
  EXPECT_EQ(gguf_tensor_name("model.layers.3.self_attn.v_proj.weight"), "blk.3.attn_v.weight");
  EXPECT_EQ(gguf_tensor_name("model.layers.3.self_attn.o_proj.weight"), "blk.3.attn_output.weight");
  EXPECT_EQ(gguf_tensor_name("model.layers.1.post_attention_layernorm.weight"),
            "blk.1.ffn_norm.weight");
  EXPECT_EQ(gguf_tensor_name("model.layers.1.mlp.gate_proj.weight"), "blk.1.ffn_gate.weight");
  EXPECT_EQ(gguf_tensor_name("model.layers.1.mlp.up_proj.weight"), "blk.1.ffn_up.weight");
  EXPECT_EQ(gguf_tensor_name("model.layers.1.mlp.down_proj.weight"), "blk.1.ffn_down.weight");
  EXPECT_THROW(gguf_tensor_name("model.layers.1.mlp.fc1.weight"), Error);
}

TEST(IoGguf, TensorTypesFollowLlamaCppDefaults) {
  const std::vector<int64_t> mat = {64, 64}, odd = {64, 172}, vec = {64};
  EXPECT_EQ(tensor_type_for(FileType::Q4_0, "model.norm.weight", vec, false),
            gguf::TensorType::F32);
  EXPECT_EQ(tensor_type_for(FileType::F16, "model.norm.weight", vec, false), gguf::TensorType::F32);
  EXPECT_EQ(tensor_type_for(FileType::F16, "lm_head.weight", mat, false), gguf::TensorType::F16);
  EXPECT_EQ(tensor_type_for(FileType::Q8_0, "lm_head.weight", mat, false), gguf::TensorType::Q8_0);
  EXPECT_EQ(tensor_type_for(FileType::Q8_0, "model.embed_tokens.weight", mat, false),
            gguf::TensorType::Q8_0);
  EXPECT_EQ(tensor_type_for(FileType::Q8_0, "x.down_proj.weight", odd, false),
            gguf::TensorType::F16);
  EXPECT_EQ(tensor_type_for(FileType::Q4_0, "x.q_proj.weight", mat, false), gguf::TensorType::Q4_0);
  EXPECT_EQ(tensor_type_for(FileType::Q4_0, "x.down_proj.weight", odd, false),
            gguf::TensorType::F16);
  EXPECT_EQ(tensor_type_for(FileType::Q4_0, "lm_head.weight", mat, false), gguf::TensorType::Q8_0);
  EXPECT_EQ(tensor_type_for(FileType::Q4_0, "model.embed_tokens.weight", mat, false),
            gguf::TensorType::Q4_0);
  EXPECT_EQ(tensor_type_for(FileType::Q4_0, "model.embed_tokens.weight", mat, true),
            gguf::TensorType::Q8_0);  // tied: the embedding is the head
  EXPECT_THROW(parse_file_type("q4_k"), Error);
}

TEST(IoGguf, PermutationTurnsRotateHalfIntoInterleavedRope) {
  // permute_rope_rows on a column of row indices: within each head of 4 rows, HF rows
  // (0, 1 | 2, 3) become (0, 2, 1, 3).
  std::vector<float> rows = {0, 1, 2, 3, 4, 5, 6, 7};
  permute_rope_rows(rows.data(), 2, 4, 1);
  EXPECT_EQ(rows, (std::vector<float>{0, 2, 1, 3, 4, 6, 5, 7}));
  // The meaning: interleaved RoPE of the permuted projection == the permuted rotate-half RoPE
  // of the HF projection, for every position.
  const int64_t hd = 8, cols = 5;
  std::mt19937 rng(1);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> w(size_t(hd * cols)), x(cols);
  for (auto& v : w) v = n(rng);
  for (auto& v : x) v = n(rng);
  std::vector<float> wp = w;
  permute_rope_rows(wp.data(), 1, hd, cols);
  auto project = [&](const std::vector<float>& m) {
    std::vector<double> y(size_t(hd), 0.0);
    for (int64_t r = 0; r < hd; ++r)
      for (int64_t k = 0; k < cols; ++k) y[size_t(r)] += double(m[size_t(r * cols + k)]) * x[k];
    return y;
  };
  for (int pos : {0, 1, 7, 100}) {
    const auto hf = rope_rotate_half(project(w), pos);
    const auto gg = rope_interleaved(project(wp), pos);
    for (int64_t i = 0; i < hd / 2; ++i) {
      EXPECT_NEAR(gg[size_t(2 * i)], hf[size_t(i)], 1e-12);
      EXPECT_NEAR(gg[size_t(2 * i + 1)], hf[size_t(i + hd / 2)], 1e-12);
    }
  }
}

TEST(IoGguf, ExportQ4_0TensorsMetadataAndTokenizer) {
  fusetune::testing::TempDir dir;
  const ModelConfig c = small_config(false);
  write_checkpoint(dir / "ck", c, spm_tokenizer_json());
  const auto r = export_gguf(dir / "ck", dir / "m.gguf", FileType::Q4_0);
  const auto f = read_gguf(dir / "m.gguf");
  const HFCheckpoint ck = load_hf_checkpoint(dir / "ck");

  EXPECT_EQ(f.kv.at("general.architecture"), "llama");
  EXPECT_EQ(f.kv.at("general.name"), "ck");
  EXPECT_EQ(f.kv.at("general.file_type"), 2);  // MOSTLY_Q4_0
  EXPECT_EQ(f.kv.at("llama.context_length"), 128);
  EXPECT_EQ(f.kv.at("llama.embedding_length"), 32);
  EXPECT_EQ(f.kv.at("llama.block_count"), 1);
  EXPECT_EQ(f.kv.at("llama.feed_forward_length"), 48);
  EXPECT_EQ(f.kv.at("llama.attention.head_count"), 4);
  EXPECT_EQ(f.kv.at("llama.attention.head_count_kv"), 2);
  EXPECT_EQ(f.kv.at("llama.rope.dimension_count"), 8);
  EXPECT_EQ(f.kv.at("llama.vocab_size"), 40);
  EXPECT_FLOAT_EQ(f.kv.at("llama.attention.layer_norm_rms_epsilon").get<float>(), 1e-5f);
  EXPECT_EQ(f.kv.at("llama.rope.freq_base"), 10000.0);
  EXPECT_EQ(f.kv.count("llama.attention.key_length"), 0u);  // head_dim * heads == hidden

  EXPECT_EQ(f.kv.at("tokenizer.ggml.model"), "llama");
  const auto& tokens = f.kv.at("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), 40u);  // padded to vocab_size
  EXPECT_EQ(tokens[9],
            "\xE2\x96\x81"
            "ab");
  EXPECT_EQ(tokens[39], "[PAD39]");
  // Scores: minus the rank of the merge that makes the piece ("ab" first, "▁ab" second).
  EXPECT_EQ(f.kv.at("tokenizer.ggml.scores")[8], -0.0);
  EXPECT_EQ(f.kv.at("tokenizer.ggml.scores")[9], -1.0);
  EXPECT_EQ(f.kv.at("tokenizer.ggml.scores")[6], 0.0);
  const auto& types = f.kv.at("tokenizer.ggml.token_type");
  EXPECT_EQ(types[0], 2);   // unknown
  EXPECT_EQ(types[1], 3);   // control
  EXPECT_EQ(types[3], 6);   // byte
  EXPECT_EQ(types[6], 1);   // normal
  EXPECT_EQ(types[39], 5);  // unused padding
  EXPECT_EQ(f.kv.at("tokenizer.ggml.bos_token_id"), 1);
  EXPECT_EQ(f.kv.at("tokenizer.ggml.eos_token_id"), 2);
  EXPECT_EQ(f.kv.at("tokenizer.ggml.unknown_token_id"), 0);
  EXPECT_EQ(f.kv.at("tokenizer.ggml.add_bos_token"), true);

  // Types and shapes.
  EXPECT_EQ(f.tensor("token_embd.weight").type, 2u);      // Q4_0 (untied)
  EXPECT_EQ(f.tensor("output.weight").type, 8u);          // Q8_0 head
  EXPECT_EQ(f.tensor("blk.0.ffn_down.weight").type, 1u);  // rows of 48: F16
  EXPECT_EQ(f.tensor("blk.0.attn_norm.weight").type, 0u);
  EXPECT_EQ(f.tensor("blk.0.attn_k.weight").ne, (std::vector<uint64_t>{32, 16}));
  EXPECT_EQ(r.tensors.size(), f.tensors.size());
  for (const auto& t : f.tensors) EXPECT_EQ(t.offset % 32, 0u) << t.name;

  // Data: q and k rows permuted, then quantized with ggml's reference quantizer, bit for bit.
  for (const auto& [hf, gg, heads] :
       {std::tuple{"model.layers.0.self_attn.q_proj.weight", "blk.0.attn_q.weight", 4},
        std::tuple{"model.layers.0.self_attn.k_proj.weight", "blk.0.attn_k.weight", 2},
        std::tuple{"model.layers.0.self_attn.v_proj.weight", "blk.0.attn_v.weight", 0}}) {
    std::vector<float> w = tensor_values(ck, hf);
    if (heads) permute_rope_rows(w.data(), heads, 8, 32);
    std::vector<ggml::BlockQ4_0> q(w.size() / 32);
    ggml::quantize_row_q4_0(w.data(), q.data(), int64_t(w.size()));
    EXPECT_EQ(0, std::memcmp(f.data(gg), q.data(), q.size() * 18)) << gg;
  }
  {
    std::vector<float> w = tensor_values(ck, "lm_head.weight");
    std::vector<ggml::BlockQ8_0> q(w.size() / 32);
    ggml::quantize_row_q8_0(w.data(), q.data(), int64_t(w.size()));
    EXPECT_EQ(0, std::memcmp(f.data("output.weight"), q.data(), q.size() * 34));
    const std::vector<float> d = tensor_values(ck, "model.layers.0.mlp.down_proj.weight");
    uint16_t h;
    std::memcpy(&h, f.data("blk.0.ffn_down.weight") + 2 * 17, 2);
    EXPECT_EQ(h, ggml::fp32_to_fp16(d[17]));
    const std::vector<float> norm = tensor_values(ck, "model.norm.weight");
    EXPECT_EQ(0, std::memcmp(f.data("output_norm.weight"), norm.data(), norm.size() * 4));
  }
}

TEST(IoGguf, TiedEmbeddingHasNoOutputTensorAndIsTheQ8_0Head) {
  fusetune::testing::TempDir dir;
  write_checkpoint(dir / "ck", small_config(true), spm_tokenizer_json());
  export_gguf(dir / "ck", dir / "m.gguf", FileType::Q4_0);
  const auto f = read_gguf(dir / "m.gguf");
  EXPECT_FALSE(f.has_tensor("output.weight"));
  EXPECT_EQ(f.tensor("token_embd.weight").type, 8u);
  EXPECT_EQ(f.tensor("token_embd.weight").ne, (std::vector<uint64_t>{32, 40}));
}

// llama_tensor_get_type: a Q4_0 file's head is Q6_K when its rows (the hidden size) are whole
// super-blocks of 256 (untied: output.weight; tied: token_embd.weight), Q8_0 when they are
// whole Q8_0 blocks only (288); a Q8_0 file keeps a Q8_0 head.
TEST(IoGguf, Q4_0HeadIsQ6_KWhenRowsAreMultiplesOf256) {
  const std::vector<int64_t> m256{40, 256}, m288{40, 288}, m512{40, 512};
  EXPECT_EQ(tensor_type_for(FileType::Q4_0, "lm_head.weight", m256, false), gguf::TensorType::Q6_K);
  EXPECT_EQ(tensor_type_for(FileType::Q4_0, "lm_head.weight", m512, false), gguf::TensorType::Q6_K);
  EXPECT_EQ(tensor_type_for(FileType::Q4_0, "lm_head.weight", m288, false), gguf::TensorType::Q8_0);
  EXPECT_EQ(tensor_type_for(FileType::Q4_0, "model.embed_tokens.weight", m256, false),
            gguf::TensorType::Q4_0);
  EXPECT_EQ(tensor_type_for(FileType::Q4_0, "model.embed_tokens.weight", m256, true),
            gguf::TensorType::Q6_K);
  EXPECT_EQ(tensor_type_for(FileType::Q8_0, "lm_head.weight", m256, false), gguf::TensorType::Q8_0);
  EXPECT_EQ(type_bytes(gguf::TensorType::Q6_K, 40 * 256), 40u * 210u);

  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    fusetune::testing::TempDir dir;
    ModelConfig c = small_config(tied);
    c.hidden_size = 256;
    c.intermediate_size = 64;
    c.head_dim = 64;  // 4 heads of 64 = 256
    write_checkpoint(dir / "ck", c, spm_tokenizer_json());
    const auto r = export_gguf(dir / "ck", dir / "m.gguf", FileType::Q4_0);
    const auto f = read_gguf(dir / "m.gguf");  // the reader checks each tensor's Q6_K size
    const std::string head = tied ? "token_embd.weight" : "output.weight";
    EXPECT_EQ(f.tensor(head).type, 14u);  // GGML_TYPE_Q6_K
    EXPECT_EQ(f.tensor(head).ne, (std::vector<uint64_t>{256, 40}));
    if (!tied) {
      EXPECT_EQ(f.tensor("token_embd.weight").type, 2u);
    }
    EXPECT_EQ(f.tensor("blk.0.attn_q.weight").type, 2u);
    // The data: ggml's reference Q6_K quantizer, byte for byte, 210 bytes per 256 values.
    const HFCheckpoint ck = load_hf_checkpoint(dir / "ck");
    std::vector<float> w = tensor_values(ck, tied ? "model.embed_tokens.weight" : "lm_head.weight");
    std::vector<ggml::BlockQ6_K> q(w.size() / 256);
    ggml::quantize_row_q6_K(w.data(), q.data(), int64_t(w.size()));
    EXPECT_EQ(0, std::memcmp(f.data(head), q.data(), q.size() * 210));
    const size_t i = size_t(std::find_if(r.tensors.begin(), r.tensors.end(),
                                         [&](const auto& e) { return e.first == head; }) -
                            r.tensors.begin());
    ASSERT_LT(i, r.tensors.size());
    EXPECT_EQ(r.tensors[i].second, gguf::TensorType::Q6_K);
    // The tensor after the head starts where the head's 40 * 210 bytes (padded to 32) end.
    for (size_t t = 0; t + 1 < f.tensors.size(); ++t)
      if (f.tensors[t].name == head) {
        EXPECT_EQ(f.tensors[t + 1].offset, f.tensors[t].offset + (40 * 210 + 31) / 32 * 32);
      }
  }
  // A Q8_0 file: the head stays Q8_0 whatever its rows.
  fusetune::testing::TempDir dir;
  ModelConfig c = small_config(false);
  c.hidden_size = 256;
  c.intermediate_size = 64;
  c.head_dim = 64;
  write_checkpoint(dir / "ck", c, spm_tokenizer_json());
  export_gguf(dir / "ck", dir / "m.gguf", FileType::Q8_0);
  EXPECT_EQ(read_gguf(dir / "m.gguf").tensor("output.weight").type, 8u);
}

TEST(IoGguf, QuantizeCommandWritesTheWeightsTheGgufDequantizesTo) {
  fusetune::testing::TempDir dir;
  write_checkpoint(dir / "ck", small_config(false), spm_tokenizer_json());
  const auto p = (dir / "ck").string(), fq = (dir / "fq").string(), g = (dir / "m.gguf").string();
  auto r1 = fusetune::testing::run_fusetune("quantize --type q4_0 --output " + fq + " " + p);
  ASSERT_EQ(r1.code, 0) << r1.out;
  auto r2 =
      fusetune::testing::run_fusetune("export --format gguf --type q4_0 --output " + g + " " + p);
  ASSERT_EQ(r2.code, 0) << r2.out;
  EXPECT_NE(r2.out.find("q4_0"), std::string::npos);
  const HFCheckpoint q = load_hf_checkpoint(dir / "fq");
  const auto f = read_gguf(dir / "m.gguf");
  EXPECT_TRUE(std::filesystem::exists(dir / "fq" / "tokenizer.json"));
  for (const auto& [hf, gg] :
       {std::pair{"model.layers.0.mlp.up_proj.weight", "blk.0.ffn_up.weight"},
        std::pair{"lm_head.weight", "output.weight"},
        std::pair{"model.layers.0.mlp.down_proj.weight", "blk.0.ffn_down.weight"},
        std::pair{"model.layers.0.self_attn.q_proj.weight", "blk.0.attn_q.weight"}}) {
    const auto& info = f.tensor(gg);
    const int64_t n = int64_t(info.ne[0] * info.ne[1]);
    std::vector<float> deq(static_cast<size_t>(n));
    if (info.type == 2) {
      ggml::dequantize_row_q4_0(reinterpret_cast<const ggml::BlockQ4_0*>(f.data(gg)), deq.data(),
                                n);
    } else if (info.type == 8) {
      ggml::dequantize_row_q8_0(reinterpret_cast<const ggml::BlockQ8_0*>(f.data(gg)), deq.data(),
                                n);
    } else {
      ASSERT_EQ(info.type, 1u);
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, f.data(gg) + 2 * i, 2);
        deq[size_t(i)] = ggml::fp16_to_fp32(h);
      }
    }
    std::vector<float> mine = tensor_values(q, hf);
    if (std::string(gg) == "blk.0.attn_q.weight") permute_rope_rows(mine.data(), 4, 8, 32);
    EXPECT_EQ(0, std::memcmp(mine.data(), deq.data(), deq.size() * 4)) << hf;
  }
  // Norms are untouched.
  const HFCheckpoint orig = load_hf_checkpoint(dir / "ck");
  EXPECT_EQ(tensor_values(q, "model.norm.weight"), tensor_values(orig, "model.norm.weight"));
}

// llama.cpp's SentencePiece tokenizer turns a character no piece covers into byte tokens: the
// piece <0x0A> for a newline, else a "\n" piece, else it aborts (std::out_of_range). A
// vocabulary with neither is still exported, with a warning that names what is missing.
TEST(IoGguf, ExportWarnsWhenLlamaCppCannotTokenizeANewline) {
  fusetune::testing::TempDir dir;
  auto warnings_of = [&](const json& tokenizer, const std::string& name) {
    write_checkpoint(dir / name, small_config(false), tokenizer);
    return export_gguf(dir / name, dir / (name + ".gguf"), FileType::F32).warnings;
  };
  // spm_tokenizer_json(): byte tokens <0x00> and <0x01> only, no "\n" piece.
  std::vector<std::string> w = warnings_of(spm_tokenizer_json(), "two_bytes");
  ASSERT_EQ(w.size(), 1u);
  EXPECT_TRUE(contains(w[0], "has 2 of the 256 byte tokens but not <0x0A> and no \"\\n\" piece"))
      << w[0];
  EXPECT_TRUE(contains(w[0], "llama.cpp aborts as soon as it tokenizes text with a newline"))
      << w[0];
  EXPECT_TRUE(contains(w[0], (dir / "two_bytes").string())) << w[0];

  // No byte token at all (the two replaced by letters).
  json none = spm_tokenizer_json();
  json& vocab = none["model"]["vocab"];
  vocab.erase("<0x00>");
  vocab.erase("<0x01>");
  vocab["c"] = 3;
  vocab["d"] = 4;
  w = warnings_of(none, "no_bytes");
  ASSERT_EQ(w.size(), 1u);
  EXPECT_TRUE(contains(w[0], "has no byte tokens (<0x00> ... <0xFF>) and no \"\\n\" piece"))
      << w[0];
  // `fusetune export` writes the file and prints the warning on stderr.
  auto r = fusetune::testing::run_fusetune("export --format gguf --output " +
                                           (dir / "cli.gguf").string() + " " +
                                           (dir / "no_bytes").string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "fusetune: warning: " + w[0] + "\n")) << r.out;
  EXPECT_TRUE(std::filesystem::exists(dir / "cli.gguf"));

  // Either piece is enough: no warning.
  json with_newline = none;
  with_newline["model"]["vocab"]["\n"] = 10;
  EXPECT_TRUE(warnings_of(with_newline, "newline_piece").empty());
  json with_byte = none;
  with_byte["model"]["vocab"].erase("d");
  with_byte["model"]["vocab"]["<0x0A>"] = 4;
  EXPECT_TRUE(warnings_of(with_byte, "newline_byte").empty());
}

TEST(IoGguf, ClearErrors) {
  fusetune::testing::TempDir dir;
  ModelConfig biased = small_config(false);
  biased.attention_bias = true;
  EXPECT_THROW(gguf_architecture(biased), Error);
  biased.model_type = "qwen2";
  EXPECT_EQ(gguf_architecture(biased), "qwen2");
  ModelConfig gelu = small_config(false);
  gelu.hidden_act = "gelu";
  EXPECT_THROW(gguf_architecture(gelu), Error);

  // A WordPiece tokenizer has no GGUF form; a missing tokenizer is named.
  json wp = {{"model", {{"type", "WordPiece"}, {"vocab", {{"a", 0}}}}}};
  write_checkpoint(dir / "wp", small_config(false), wp);
  auto r = fusetune::testing::run_fusetune("export --format gguf --output " +
                                           (dir / "x.gguf").string() + " " + (dir / "wp").string());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("WordPiece"), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(dir / "x.gguf"));
  std::filesystem::remove(dir / "wp" / "tokenizer.json");
  r = fusetune::testing::run_fusetune("export --format gguf --output " + (dir / "x.gguf").string() +
                                      " " + (dir / "wp").string());
  EXPECT_NE(r.out.find("no tokenizer.model or tokenizer.json"), std::string::npos) << r.out;
  r = fusetune::testing::run_fusetune("export --format onnx --output x " + (dir / "wp").string());
  EXPECT_NE(r.out.find("--format must be gguf"), std::string::npos) << r.out;
  r = fusetune::testing::run_fusetune("export --format gguf --type q5_k --output x " +
                                      (dir / "wp").string());
  EXPECT_NE(r.out.find("--type must be f32, f16, q8_0 or q4_0"), std::string::npos) << r.out;
  r = fusetune::testing::run_fusetune("quantize --type f32 --output x " + (dir / "wp").string());
  EXPECT_NE(r.out.find("not a quantization"), std::string::npos) << r.out;
}

TEST(IoGguf, Qwen2WithBiasesAndAByteLevelTokenizer) {
  fusetune::testing::TempDir dir;
  ModelConfig c = small_config(false);
  c.model_type = "qwen2";
  c.attention_bias = true;
  c.bos_token_id = -1;
  c.eos_token_id = -1;
  // Byte-level BPE with Qwen2's split pattern and merges as [a, b] pairs; two added tokens.
  const std::string qwen2_split =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
      "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  json vocab = json::object();
  for (int i = 0; i < 30; ++i) vocab[std::string(1, char('a' + i % 26)) + std::to_string(i)] = i;
  json tokenizer = {
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", json::array({json::array({"a0", "b1"}), json::array({"c2", "d3"})})}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", qwen2_split}}}, {"behavior", "Isolated"}},
          {{"type", "ByteLevel"}, {"use_regex", false}}}}}},
      {"added_tokens",
       {{{"id", 30}, {"content", "<|end|>"}, {"special", true}},
        {{"id", 31}, {"content", "word"}, {"special", false}}}}};
  write_checkpoint(dir / "ck", c, tokenizer);
  std::ofstream(dir / "ck" / "tokenizer_config.json") << json{{"eos_token", "<|end|>"}}.dump();
  export_gguf(dir / "ck", dir / "m.gguf", FileType::F32);
  const auto f = read_gguf(dir / "m.gguf");
  const HFCheckpoint ck = load_hf_checkpoint(dir / "ck");

  EXPECT_EQ(f.kv.at("general.architecture"), "qwen2");
  EXPECT_EQ(f.kv.at("qwen2.attention.head_count_kv"), 2);
  EXPECT_EQ(f.kv.count("llama.block_count"), 0u);
  EXPECT_EQ(f.kv.at("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f.kv.at("tokenizer.ggml.pre"), "qwen2");
  EXPECT_EQ(f.kv.at("tokenizer.ggml.merges"), json({"a0 b1", "c2 d3"}));
  EXPECT_EQ(f.kv.count("tokenizer.ggml.scores"), 0u);
  EXPECT_EQ(f.kv.at("tokenizer.ggml.token_type")[30], 3);  // special: control
  EXPECT_EQ(f.kv.at("tokenizer.ggml.token_type")[31], 4);  // added, not special: user-defined
  EXPECT_EQ(f.kv.at("tokenizer.ggml.eos_token_id"), 30);   // named in tokenizer_config.json
  EXPECT_EQ(f.kv.count("tokenizer.ggml.bos_token_id"), 0u);
  EXPECT_EQ(f.kv.count("tokenizer.ggml.add_bos_token"), 0u);  // unknown: llama.cpp's default
  // NEOX RoPE in llama.cpp's qwen2: q stays in HF's row order; the biases are there, F32.
  const auto q = tensor_values(ck, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(0, std::memcmp(f.data("blk.0.attn_q.weight"), q.data(), q.size() * 4));
  EXPECT_EQ(f.tensor("blk.0.attn_k.bias").ne, (std::vector<uint64_t>{16}));
  const auto kb = tensor_values(ck, "model.layers.0.self_attn.k_proj.bias");
  EXPECT_EQ(0, std::memcmp(f.data("blk.0.attn_k.bias"), kb.data(), kb.size() * 4));

  // An unknown split pattern is refused, naming the file.
  tokenizer["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+";
  std::ofstream(dir / "ck" / "tokenizer.json") << tokenizer.dump();
  try {
    export_gguf(dir / "ck", dir / "m2.gguf", FileType::F32);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.json': its pre-tokenizer split pattern"),
              std::string::npos)
        << e.what();
  }
}

TEST(IoGguf, Llama3RopeScalingBecomesRopeFreqs) {
  fusetune::testing::TempDir dir;
  ModelConfig c = small_config(true);
  c.rope_theta = 500000;
  c.rope_scaling.rope_type = "llama3";
  c.rope_scaling.factor = 8;
  c.rope_scaling.low_freq_factor = 1;
  c.rope_scaling.high_freq_factor = 4;
  c.rope_scaling.original_max_position_embeddings = 8192;
  write_checkpoint(dir / "ck", c, spm_tokenizer_json());
  export_gguf(dir / "ck", dir / "m.gguf", FileType::F32);
  const auto f = read_gguf(dir / "m.gguf");
  ASSERT_EQ(f.tensor("rope_freqs.weight").ne, (std::vector<uint64_t>{4}));
  float r[4];
  std::memcpy(r, f.data("rope_freqs.weight"), sizeof r);
  // head_dim 8: wavelengths 2 pi / 500000^(-i/8), i = 0, 2, 4, 6: 6.3, 167, 4443, 118137.
  // Below 8192/4 = 2048: 1; above 8192: the factor 8; 4443 in between: smooth =
  // (8192/4443 - 1) / 3 = 0.2813, 1 / ((1 - smooth) / 8 + smooth) = 2.6945.
  EXPECT_EQ(r[0], 1.0f);
  EXPECT_EQ(r[1], 1.0f);
  EXPECT_NEAR(r[2], 2.6945, 1e-3);
  EXPECT_EQ(r[3], 8.0f);
}

// Gemma: architecture gemma, q/k rows as HF stores them (NEOX RoPE), every norm written as
// 1 + w (llama.cpp's gemma multiplies by the stored weight), no output.weight (the head is
// token_embd); an untied Gemma or a SiLU one has no GGUF gemma form.
TEST(IoGguf, GemmaNormsAreOnePlusWAndTheHeadIsTheEmbedding) {
  fusetune::testing::TempDir dir;
  ModelConfig c = small_config(true);
  c.model_type = "gemma";
  c.hidden_act = "gelu_pytorch_tanh";
  write_checkpoint(dir / "ck", c, spm_tokenizer_json());
  export_gguf(dir / "ck", dir / "m.gguf", FileType::F32);
  const auto f = read_gguf(dir / "m.gguf");
  const HFCheckpoint ck = load_hf_checkpoint(dir / "ck");
  EXPECT_EQ(f.kv.at("general.architecture"), "gemma");
  EXPECT_FALSE(f.has_tensor("output.weight"));
  auto read = [&](const std::string& name, size_t n) {
    std::vector<float> v(n);
    std::memcpy(v.data(), f.data(name), n * sizeof(float));
    return v;
  };
  for (const auto& [hf, gg] :
       {std::pair{"model.layers.0.input_layernorm.weight", "blk.0.attn_norm.weight"},
        std::pair{"model.layers.0.post_attention_layernorm.weight", "blk.0.ffn_norm.weight"},
        std::pair{"model.norm.weight", "output_norm.weight"}}) {
    const std::vector<float> w = tensor_values(ck, hf), g = read(gg, w.size());
    for (size_t i = 0; i < w.size(); ++i) EXPECT_EQ(g[i], w[i] + 1.0f) << gg << " " << i;
  }
  const std::vector<float> q = tensor_values(ck, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(read("blk.0.attn_q.weight", q.size()), q);  // not permuted
  ModelConfig untied = c;
  untied.tie_word_embeddings = false;
  EXPECT_THROW(gguf_architecture(untied), Error);
  ModelConfig silu = c;
  silu.hidden_act = "silu";
  EXPECT_THROW(gguf_architecture(silu), Error);
}

// Gemma 2: architecture gemma2 with llama.cpp's names for the post-norms (post_attention_norm,
// ffn_norm before the MLP, post_ffw_norm), all written as 1 + w; the soft-caps and the window
// as metadata; a query_pre_attn_scalar or a layer pattern llama.cpp cannot express is refused.
TEST(IoGguf, Gemma2PostNormsSoftcapsAndWindow) {
  fusetune::testing::TempDir dir;
  ModelConfig c = small_config(true);
  c.model_type = "gemma2";
  c.hidden_act = "gelu_pytorch_tanh";
  c.num_hidden_layers = 2;
  c.attn_logit_softcapping = 50;
  c.final_logit_softcapping = 30;
  c.query_pre_attn_scalar = 8;  // head_dim
  c.sliding_window = 64;
  c.layer_types = {"sliding_attention", "full_attention"};
  write_checkpoint(dir / "ck", c, spm_tokenizer_json());
  export_gguf(dir / "ck", dir / "m.gguf", FileType::F32);
  const auto f = read_gguf(dir / "m.gguf");
  const HFCheckpoint ck = load_hf_checkpoint(dir / "ck");
  EXPECT_EQ(f.kv.at("general.architecture"), "gemma2");
  EXPECT_EQ(f.kv.at("gemma2.attn_logit_softcapping"), 50.0);
  EXPECT_EQ(f.kv.at("gemma2.final_logit_softcapping"), 30.0);
  EXPECT_EQ(f.kv.at("gemma2.attention.sliding_window"), 64);
  auto read = [&](const std::string& name, size_t n) {
    std::vector<float> v(n);
    std::memcpy(v.data(), f.data(name), n * sizeof(float));
    return v;
  };
  for (const auto& [hf, gg] :
       {std::pair{"model.layers.1.input_layernorm.weight", "blk.1.attn_norm.weight"},
        std::pair{"model.layers.1.post_attention_layernorm.weight",
                  "blk.1.post_attention_norm.weight"},
        std::pair{"model.layers.1.pre_feedforward_layernorm.weight", "blk.1.ffn_norm.weight"},
        std::pair{"model.layers.1.post_feedforward_layernorm.weight",
                  "blk.1.post_ffw_norm.weight"}}) {
    const std::vector<float> w = tensor_values(ck, hf), g = read(gg, w.size());
    for (size_t i = 0; i < w.size(); ++i) EXPECT_EQ(g[i], w[i] + 1.0f) << gg << " " << i;
  }
  ModelConfig scalar = c;
  scalar.query_pre_attn_scalar = 9;
  EXPECT_THROW(gguf_architecture(scalar), Error);
  ModelConfig pattern = c;
  pattern.layer_types = {"full_attention", "sliding_attention"};
  EXPECT_THROW(gguf_architecture(pattern), Error);
}
