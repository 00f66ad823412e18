#include "fusetune/io/gguf_export.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <numbers>
#include <regex>

#include "fusetune/io/gguf_tokenizer.h"
#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/kernels/cpu/ggml_quant.h"
#include "fusetune/models/model_family.h"
#include "fusetune/util/error.h"

namespace fusetune::gguf {
namespace {

namespace fs = std::filesystem;

bool is_head(const std::string& hf_name, bool tied) {
  return hf_name == "lm_head.weight" || (tied && hf_name == "model.embed_tokens.weight");
}

template <class Block>
std::vector<uint8_t> quantize_bytes(const float* x, int64_t n, int64_t block,
                                    void (*q)(const float*, Block*, int64_t)) {
  std::vector<uint8_t> out(size_t(n / block) * sizeof(Block));
  q(x, reinterpret_cast<Block*>(out.data()), n);
  return out;
}

std::vector<uint8_t> encode(TensorType t, const float* x, int64_t n) {
  switch (t) {
    case TensorType::F32: {
      std::vector<uint8_t> out(size_t(n) * 4);
      std::memcpy(out.data(), x, out.size());
      return out;
    }
    case TensorType::F16: {
      std::vector<uint8_t> out(size_t(n) * 2);
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = ggml::fp32_to_fp16(x[i]);
        std::memcpy(out.data() + 2 * i, &h, 2);
      }
      return out;
    }
    case TensorType::Q4_0:
      return quantize_bytes<ggml::BlockQ4_0>(x, n, ggml::kBlock, ggml::quantize_row_q4_0);
    case TensorType::Q8_0:
      return quantize_bytes<ggml::BlockQ8_0>(x, n, ggml::kBlock, ggml::quantize_row_q8_0);
    case TensorType::Q6_K:
      return quantize_bytes<ggml::BlockQ6_K>(x, n, ggml::kBlockK, ggml::quantize_row_q6_K);
  }
  return {};
}

// Llama 3 RoPE scaling is a tensor in GGUF: per frequency pair, the factor llama.cpp divides
// the rotation frequency by (convert_hf_to_gguf.py's LlamaModel rope_freqs).
std::vector<float> llama3_rope_factors(const ModelConfig& c) {
  const RopeScaling& rs = c.rope_scaling;
  const double low_wavelen = double(rs.original_max_position_embeddings) / rs.low_freq_factor;
  const double high_wavelen = double(rs.original_max_position_embeddings) / rs.high_freq_factor;
  std::vector<float> f;
  for (int64_t i = 0; i < c.head_dim; i += 2) {
    const double freq = 1.0 / std::pow(c.rope_theta, double(i) / double(c.head_dim));
    const double wavelen = 2 * std::numbers::pi / freq;
    if (wavelen < high_wavelen) {
      f.push_back(1.0f);
    } else if (wavelen > low_wavelen) {
      f.push_back(float(rs.factor));
    } else {
      const double smooth =
          (double(rs.original_max_position_embeddings) / wavelen - rs.low_freq_factor) /
          (rs.high_freq_factor - rs.low_freq_factor);
      f.push_back(float(1.0 / ((1 - smooth) / rs.factor + smooth)));
    }
  }
  return f;
}

}  // namespace

FileType parse_file_type(const std::string& s, const std::string& what) {
  if (s == "f32") return FileType::F32;
  if (s == "f16") return FileType::F16;
  if (s == "q8_0") return FileType::Q8_0;
  if (s == "q4_0") return FileType::Q4_0;
  throw Error(what + " must be f32, f16, q8_0 or q4_0, got '" + s + "'");
}

const char* file_type_name(FileType t) {
  switch (t) {
    case FileType::F32:
      return "f32";
    case FileType::F16:
      return "f16";
    case FileType::Q8_0:
      return "q8_0";
    case FileType::Q4_0:
      return "q4_0";
  }
  return "?";
}

TensorType tensor_type_for(FileType ft, const std::string& hf_name,
                           const std::vector<int64_t>& shape, bool tie_word_embeddings) {
  if (shape.size() < 2) return TensorType::F32;
  const bool blocks_fit = shape.back() % 32 == 0;
  switch (ft) {
    case FileType::F32:
      return TensorType::F32;
    case FileType::F16:
      return TensorType::F16;
    case FileType::Q8_0:
      return blocks_fit ? TensorType::Q8_0 : TensorType::F16;
    case FileType::Q4_0:
      if (!blocks_fit) return TensorType::F16;
      // llama_tensor_get_type: the head is Q6_K unless its rows are not whole super-blocks.
      if (is_head(hf_name, tie_word_embeddings))
        return shape.back() % ggml::kBlockK == 0 ? TensorType::Q6_K : TensorType::Q8_0;
      return TensorType::Q4_0;
  }
  return TensorType::F32;
}

void fake_quantize(TensorType t, float* x, int64_t numel) {
  switch (t) {
    case TensorType::F32:
      return;
    case TensorType::F16:
      for (int64_t i = 0; i < numel; ++i) x[i] = ggml::fp16_to_fp32(ggml::fp32_to_fp16(x[i]));
      return;
    case TensorType::Q4_0:
      ggml::fake_quantize_row_q4_0(x, x, numel);
      return;
    case TensorType::Q8_0:
      ggml::fake_quantize_row_q8_0(x, x, numel);
      return;
    case TensorType::Q6_K:
      ggml::fake_quantize_row_q6_K(x, x, numel);
      return;
  }
}

std::string gguf_tensor_name(const std::string& hf_name, bool post_norms) {
  if (hf_name == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf_name == "model.norm.weight") return "output_norm.weight";
  if (hf_name == "lm_head.weight") return "output.weight";
  static const std::regex layer(R"(model\.layers\.(\d+)\.(.+)\.(weight|bias))");
  static const std::pair<const char*, const char*> names[] = {
      {"input_layernorm", "attn_norm"},    {"self_attn.q_proj", "attn_q"},
      {"self_attn.k_proj", "attn_k"},      {"self_attn.v_proj", "attn_v"},
      {"self_attn.o_proj", "attn_output"}, {"post_attention_layernorm", "ffn_norm"},
      {"self_attn.q_norm", "attn_q_norm"}, {"self_attn.k_norm", "attn_k_norm"},
      {"mlp.gate_proj", "ffn_gate"},       {"mlp.up_proj", "ffn_up"},
      {"mlp.down_proj", "ffn_down"},       {"self_attn.qkv_proj", "attn_qkv"},
      {"mlp.gate_up_proj", "ffn_up"}};  // Phi-3's fused projections, stored as HF does
  static const std::pair<const char*, const char*> post_norm_names[] = {
      {"post_attention_layernorm", "post_attention_norm"},
      {"pre_feedforward_layernorm", "ffn_norm"},
      {"post_feedforward_layernorm", "post_ffw_norm"}};
  std::smatch m;
  if (std::regex_match(hf_name, m, layer) && post_norms)
    for (const auto& [hf, gg] : post_norm_names)
      if (m[2] == hf) return "blk." + m[1].str() + "." + gg + "." + m[3].str();
  if (std::regex_match(hf_name, m, layer))
    for (const auto& [hf, gg] : names)
      if (m[2] == hf) return "blk." + m[1].str() + "." + gg + "." + m[3].str();
  throw Error("no GGUF tensor name for the parameter '" + hf_name + "'");
}

void permute_rope_rows(float* w, int64_t n_head, int64_t head_dim, int64_t cols) {
  std::vector<float> head(size_t(head_dim * cols));
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < n_head; ++h) {
    float* base = w + h * head_dim * cols;
    std::memcpy(head.data(), base, head.size() * sizeof(float));
    for (int64_t i = 0; i < half; ++i)
      for (int64_t s = 0; s < 2; ++s)
        std::memcpy(base + (2 * i + s) * cols, head.data() + (s * half + i) * cols,
                    size_t(cols) * sizeof(float));
  }
}

std::string gguf_architecture(const ModelConfig& c) {
  const ModelFamily& family = model_family(c.model_type, "config.json");
  // llama.cpp's architecture fixes the MLP's activation: SiLU, or the tanh GELU for gemma.
  FT_CHECK(c.hidden_act == family.default_activation,
           "config.json: " + std::string(family.activation_key) + " '" + c.hidden_act +
               "' has no GGUF " + std::string(family.gguf_arch) + " architecture (" +
               std::string(family.default_activation) + " only)");
  // llama.cpp's gemma reads no output.weight: its head is always token_embd.
  FT_CHECK(c.tie_word_embeddings || !family.default_tie_word_embeddings,
           "config.json: tie_word_embeddings: false (a " + c.model_type +
               " with its own lm_head) is not expressible as GGUF " +
               std::string(family.gguf_arch));
  FT_CHECK(!c.mlp_bias, "config.json: mlp_bias: true has no GGUF " + std::string(family.gguf_arch) +
                            " architecture");
  // llama.cpp's llama architecture reads no q/k/v biases; qwen2's always has them.
  FT_CHECK(!c.attention_bias || family.qkv_bias,
           "config.json: attention_bias: true (a " + c.model_type +
               " with q/k/v biases) is not expressible as GGUF " + std::string(family.gguf_arch));
  // llama.cpp's gemma2 and gemma3 scale the scores by head_dim^-1/2 (hidden_size / heads for
  // their 27B), not by query_pre_attn_scalar, and window all but every 2nd (6th) layer.
  if (family.reads_query_pre_attn_scalar) {
    // The 27B: 46 layers (Gemma 2), 62 (Gemma 3).
    const bool big = c.num_hidden_layers == 46 || c.num_hidden_layers == 62;
    const double base = big ? double(c.hidden_size / c.num_attention_heads) : double(c.head_dim);
    FT_CHECK(c.query_pre_attn_scalar == base,
             "config.json: query_pre_attn_scalar " + std::to_string(c.query_pre_attn_scalar) +
                 " is not expressible as GGUF " + std::string(family.gguf_arch) +
                 " (llama.cpp scales by " + std::to_string(base) + "^-1/2)");
  }
  // llama.cpp's gemma2 always caps (family default caps), its gemma3 never does.
  const bool caps = family.default_attn_softcap > 0;
  FT_CHECK(!family.reads_softcaps ||
               (caps ? c.attn_logit_softcapping > 0 && c.final_logit_softcapping > 0
                     : c.attn_logit_softcapping == 0 && c.final_logit_softcapping == 0),
           "config.json: a " + c.model_type + (caps ? " without" : " with") +
               " soft-caps is not expressible as GGUF " + std::string(family.gguf_arch));
  // llama.cpp's gemma3 rotates its local layers by 10000, unscaled.
  FT_CHECK(family.default_rope_local_base_freq == 0 ||
               c.rope_local_base_freq == family.default_rope_local_base_freq,
           "config.json: rope_local_base_freq " + std::to_string(c.rope_local_base_freq) +
               " is not expressible as GGUF " + std::string(family.gguf_arch));
  if (family.sliding_pattern > 0)
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
      FT_CHECK(is_sliding_layer(c, i) == ((i + 1) % family.sliding_pattern != 0),
               "config.json: layer_types is not expressible as GGUF " +
                   std::string(family.gguf_arch) + " (llama.cpp windows all but every " +
                   std::to_string(family.sliding_pattern) + "th layer)");
  return std::string(family.gguf_arch);
}

namespace {

// What convert_hf_to_gguf.py writes for a Phi-3: the window (every layer), and for LongRoPE the
// original context and the cos/sin scale (the factors themselves are tensors).
void add_phi3_metadata(Writer& w, const std::string& arch, const ModelConfig& c) {
  if (c.sliding_window > 0)
    w.add_u32(arch + ".attention.sliding_window", uint32_t(c.sliding_window));
  if (c.rope_scaling.rope_type != "longrope") return;
  w.add_u32(arch + ".rope.scaling.original_context_length",
            uint32_t(c.rope_scaling.original_max_position_embeddings));
  w.add_f32(arch + ".rope.scaling.attn_factor", float(c.rope_scaling.attention_factor));
}

}  // namespace

ExportResult export_gguf(const fs::path& dir, const fs::path& output, FileType type) {
  auto ck = std::make_shared<HFCheckpoint>(load_hf_checkpoint(dir, {}, DType::F32));
  const ModelConfig& c = ck->config;
  const std::string arch = gguf_architecture(c);
  const ModelFamily& family = model_family(c.model_type);
  const bool permute = family.gguf_permutes_rope_rows;

  Writer w;
  w.add_string("general.architecture", arch);
  std::string name = fs::absolute(dir).lexically_normal().filename().string();
  if (name.empty()) name = fs::absolute(dir).lexically_normal().parent_path().filename().string();
  w.add_string("general.name", name);
  const uint32_t ftype[] = {0, 1, 7, 2};  // llama_ftype: ALL_F32, MOSTLY_F16, Q8_0, Q4_0
  w.add_u32("general.file_type", ftype[int(type)]);
  w.add_u32(arch + ".context_length", uint32_t(c.max_position_embeddings));
  w.add_u32(arch + ".embedding_length", uint32_t(c.hidden_size));
  w.add_u32(arch + ".block_count", uint32_t(c.num_hidden_layers));
  w.add_u32(arch + ".feed_forward_length", uint32_t(c.intermediate_size));
  w.add_u32(arch + ".attention.head_count", uint32_t(c.num_attention_heads));
  w.add_u32(arch + ".attention.head_count_kv", uint32_t(c.num_key_value_heads));
  w.add_f32(arch + ".rope.freq_base", float(c.rope_theta));
  w.add_f32(arch + ".attention.layer_norm_rms_epsilon", float(c.rms_norm_eps));
  w.add_u32(arch + ".rope.dimension_count", uint32_t(c.head_dim));
  w.add_u32(arch + ".vocab_size", uint32_t(c.vocab_size));
  if (c.head_dim * c.num_attention_heads != c.hidden_size) {
    w.add_u32(arch + ".attention.key_length", uint32_t(c.head_dim));
    w.add_u32(arch + ".attention.value_length", uint32_t(c.head_dim));
  }
  if (family.sliding_pattern > 0)
    w.add_u32(arch + ".attention.sliding_window", uint32_t(c.sliding_window));
  if (family.reads_softcaps && family.default_attn_softcap > 0) {  // absent: llama.cpp's defaults
    w.add_f32(arch + ".attn_logit_softcapping", float(c.attn_logit_softcapping));
    w.add_f32(arch + ".final_logit_softcapping", float(c.final_logit_softcapping));
  }
  if (c.rope_scaling.rope_type == "linear") {
    w.add_string(arch + ".rope.scaling.type", "linear");
    w.add_f32(arch + ".rope.scaling.factor", float(c.rope_scaling.factor));
  }
  if (family.fused_projections) add_phi3_metadata(w, arch, c);
  const GGUFTokenizer tokenizer =
      read_gguf_tokenizer(dir, c.vocab_size, c.bos_token_id, c.eos_token_id);
  add_tokenizer_metadata(w, tokenizer);

  ExportResult result;
  result.warnings = tokenizer.warnings;
  auto add = [&](TensorEntry e) {
    result.tensors.push_back({e.name, e.type});
    int64_t n = 1;
    for (int64_t d : e.shape) n *= d;
    result.bytes += type_bytes(e.type, n);
    w.add_tensor(std::move(e));
  };
  // Phi-3's LongRoPE: llama.cpp divides its frequencies by these, the long ones when the
  // context exceeds rope.scaling.original_context_length.
  if (c.rope_scaling.rope_type == "longrope")
    for (const auto& [gguf, factors] :
         {std::pair{"rope_factors_long.weight", c.rope_scaling.long_factor},
          std::pair{"rope_factors_short.weight", c.rope_scaling.short_factor}}) {
      std::vector<float> f(factors.begin(), factors.end());
      add({gguf, {int64_t(f.size())}, TensorType::F32, [f] {
             return encode(TensorType::F32, f.data(), int64_t(f.size()));
           }});
    }
  if (c.rope_scaling.rope_type == "llama3") {
    auto f = llama3_rope_factors(c);
    add({"rope_freqs.weight", {int64_t(f.size())}, TensorType::F32, [f] {
           return encode(TensorType::F32, f.data(), int64_t(f.size()));
         }});
  }
  for (const auto& [hf_name, shape] : expected_parameters(c)) {
    const TensorType t = tensor_type_for(type, hf_name, shape, c.tie_word_embeddings);
    // Gemma's (1 + w) norms: llama.cpp's gemma multiplies by the weight as stored, so the
    // file holds w + 1 (convert_hf_to_gguf.py does the same).
    const bool add_one =
        family.norm_adds_one && shape.size() == 1 && hf_name.ends_with("norm.weight");
    int64_t heads = 0;
    if (permute && hf_name.find("self_attn.q_proj.weight") != std::string::npos)
      heads = c.num_attention_heads;
    if (permute && hf_name.find("self_attn.k_proj.weight") != std::string::npos)
      heads = c.num_key_value_heads;
    add({gguf_tensor_name(hf_name, family.post_norms), shape, t,
         [ck, hf_name = hf_name, shape = shape, t, heads, hd = c.head_dim, add_one] {
           const Tensor& src = ck->tensors.at(hf_name);
           std::vector<float> x(src.data<float>(), src.data<float>() + src.numel());
           if (heads > 0) permute_rope_rows(x.data(), heads, hd, shape.back());
           if (add_one)
             for (float& v : x) v += 1.0f;
           return encode(t, x.data(), int64_t(x.size()));
         }});
  }
  w.write(output);
  return result;
}

}  // namespace fusetune::gguf
