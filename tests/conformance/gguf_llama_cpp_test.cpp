// GGUF exports run by a real llama.cpp: stories260K (F32, F16, Q8_0, Q4_0), a hidden-256 model's
// Q6_K head, a random Qwen3 and a random Gemma (F32, at the end of the file).
//
// stories260K exported to GGUF (F32, F16, Q8_0, Q4_0) and run by a real llama.cpp (node-llama-cpp
// 3.21.1's prebuilt CPU build, tools/llama-cpp-ref): its log-probabilities on a story agree
// with fusetune's evaluation of the same weights (for F16/Q8_0/Q4_0: fusetune on
// dequantize(quantize(W)), i.e. `fusetune quantize`'s checkpoint), and its tokenizer, read
// from the GGUF metadata, encodes text as fusetune does. Skips without node-llama-cpp
// (scripts/prepare_llama_cpp.sh installs it).
//
// What remains between the two for Q8_0/Q4_0 is llama.cpp's activation rounding, not in the
// weights: its CPU matmul quantizes each activation row to Q8_0 blocks for Q4_0/Q8_0 weights
// (and to fp16 for F16 weights, as stories260K's ffn_down with rows of 172 is in Q8_0/Q4_0
// files; at this size that part is within the noise). The test prints the differences and
// bounds them by the noise floor of that rounding.
//
// stories260K's dim of 64 keeps a Q4_0 file's head Q8_0; a random model of hidden size 256 with
// its tokenizer has llama.cpp's Q6_K head (on Q8_K activations), compared with fusetune's QAT
// evaluation (gguf_q4_0 fake quantization) and with the weights fake-quantized.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <numbers>
#include <random>

#include "fusetune/io/gguf_export.h"
#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/io/hf_config.h"
#include "fusetune/kernels/cpu/ggml_quant.h"
#include "fusetune/models/model_family.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/quant/qat.h"
#include "fusetune/runtime/eager_executor.h"
#include "fusetune/tokenizers/hf_tokenizer.h"
#include "fusetune/tokenizers/sentencepiece_tokenizer.h"
#include "fusetune/tokenizers/unicode_normalize.h"
#include "test_support.h"

using namespace fusetune;
namespace fs = std::filesystem;

namespace {

fs::path ref_dir() { return fs::path(fusetune::testing::source_dir()) / "tools" / "llama-cpp-ref"; }

std::string llama_cpp_unavailable() {
  if (std::system("node --version >/dev/null 2>&1") != 0) return "node is not installed";
  if (!fs::exists(ref_dir() / "node_modules" / "node-llama-cpp"))
    return "node-llama-cpp is not installed: run scripts/prepare_llama_cpp.sh";
  return "";
}

std::string ids_csv(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

nlohmann::json run_llama_cpp(const fs::path& gguf, const std::vector<int32_t>& ids,
                             const std::string& text, const fs::path& tmp) {
  const fs::path out = tmp / "out.json", log = tmp / "node.log", text_file = tmp / "text.txt";
  std::ofstream(text_file) << text;
  const std::string cmd = "node '" + (ref_dir() / "logits.mjs").string() + "' --model '" +
                          gguf.string() + "' --tokens " + ids_csv(ids) + " --text \"$(cat '" +
                          text_file.string() + "')\" >'" + out.string() + "' 2>'" + log.string() +
                          "'";
  if (std::system(cmd.c_str()) != 0) {
    std::ifstream in(log);
    throw std::runtime_error("llama.cpp failed: " + cmd + "\n" +
                             std::string(std::istreambuf_iterator<char>(in), {}));
  }
  std::ifstream in(out);
  return nlohmann::json::parse(in);
}

// fusetune's log-softmax rows for `ids` with `params` (with `llama`'s hooks: QAT's fake
// quantization).
std::vector<std::vector<double>> fusetune_logprobs(const ModelConfig& c, const TensorMap& params,
                                                   const std::vector<int32_t>& ids,
                                                   const LlamaOptions& llama = {}) {
  const int64_t T = int64_t(ids.size());
  Graph g = build_logits_graph(c, 1, T, DType::F32, llama);
  Tensor tok = Tensor::empty({1, T}, DType::I32), pos = Tensor::empty({1, T}, DType::I32);
  for (int64_t i = 0; i < T; ++i) {
    tok.data<int32_t>()[i] = ids[size_t(i)];
    pos.data<int32_t>()[i] = int32_t(i);
  }
  EagerExecutor ex(g);
  Tensor logits = ex.run({{"tokens", tok}, {"positions", pos}}, params)[0];
  const int64_t V = logits.dim(1);
  std::vector<std::vector<double>> out;
  for (int64_t t = 0; t < T; ++t) {
    const float* row = logits.data<float>() + t * V;
    double mx = row[0], s = 0;
    for (int64_t j = 1; j < V; ++j) mx = std::max(mx, double(row[j]));
    for (int64_t j = 0; j < V; ++j) s += std::exp(double(row[j]) - mx);
    std::vector<double> lp(static_cast<size_t>(V));
    for (int64_t j = 0; j < V; ++j) lp[size_t(j)] = double(row[j]) - mx - std::log(s);
    out.push_back(std::move(lp));
  }
  return out;
}

double mean_nll(const std::vector<std::vector<double>>& lp, const std::vector<int32_t>& ids) {
  double s = 0;
  for (size_t t = 0; t + 1 < ids.size(); ++t) s -= lp[t][size_t(ids[t + 1])];
  return s / double(ids.size() - 1);
}

struct Diff {
  double max_abs = 0, max_rel = 0, mean_abs = 0;
};
// Over the tokens with a log-probability above -20 (llama.cpp's probabilities are fp32).
Diff compare(const std::vector<std::vector<double>>& a, const nlohmann::json& b) {
  Diff d;
  for (size_t t = 0; t < a.size(); ++t)
    for (size_t j = 0; j < a[t].size(); ++j) {
      if (a[t][j] < -20) continue;
      const double e = std::fabs(a[t][j] - b[t][j].get<double>());
      d.max_abs = std::max(d.max_abs, e);
      d.mean_abs += e / double(a.size() * a[t].size());
      d.max_rel = std::max(d.max_rel, e / std::max(1.0, std::fabs(a[t][j])));
    }
  return d;
}

// llama.cpp's CPU matmul rounds the activation row before the dot products: to Q8_0 blocks
// for Q4_0/Q8_0 weights (x86's quantize_row_q8_0: d = amax / 127 stored as fp16, q =
// round-half-even(x * 127 / amax)), to Q8_K blocks of 256 for Q6_K weights (the reference
// quantize_row_q8_K: d = max / -127 in fp32 for the signed max, q = round-half-even(x / d)),
// to fp16 for F16 weights.
void round_activations(gguf::TensorType w, std::vector<double>& x) {
  if (w == gguf::TensorType::Q6_K) {
    for (size_t b = 0; b < x.size(); b += 256) {
      float mx = 0, amax = 0;
      for (size_t j = b; j < b + 256; ++j)
        if (std::fabs(float(x[j])) > amax) amax = std::fabs(float(x[j])), mx = float(x[j]);
      const float iscale = amax != 0.0f ? -127.0f / mx : 0.0f, d = amax != 0.0f ? 1 / iscale : 0;
      for (size_t j = b; j < b + 256; ++j)
        x[j] = std::min(127.0f, std::nearbyint(iscale * float(x[j]))) * d;
    }
  } else if (w == gguf::TensorType::F16) {
    for (double& v : x) v = ggml::fp16_to_fp32(ggml::fp32_to_fp16(float(v)));
  } else if (w == gguf::TensorType::Q4_0 || w == gguf::TensorType::Q8_0) {
    for (size_t b = 0; b < x.size(); b += 32) {
      float amax = 0;
      for (size_t j = b; j < b + 32; ++j) amax = std::max(amax, std::fabs(float(x[j])));
      const float d = ggml::fp16_to_fp32(ggml::fp32_to_fp16(amax / 127.0f));
      const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
      for (size_t j = b; j < b + 32; ++j) x[j] = std::nearbyint(float(x[j]) * id) * d;
    }
  }
}

// llama.cpp's CPU GELU (ggml's GGML_GELU_FP16 path): the tanh GELU looked up in a table of
// fp16 results indexed by the fp16-rounded input, 0 below -10 and the identity above 10.
double ggml_gelu_table(double x) {
  if (x <= -10) return 0;
  if (x >= 10) return x;
  const float v = ggml::fp16_to_fp32(ggml::fp32_to_fp16(float(x)));
  const float g =
      0.5f * v *
      (1.0f + std::tanh(0.79788456080286535587989211986876f * v * (1.0f + 0.044715f * v * v)));
  return ggml::fp16_to_fp32(ggml::fp32_to_fp16(g));
}

// PyTorch's gelu(approximate="tanh") in double.
double gelu_tanh(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}

// An independent Llama forward (double precision, HF's rotate-half RoPE) over `params`, with
// llama.cpp's activation rounding in front of each matmul when `act` is set, after scaling the
// activations by (1 + perturb): log-softmax rows. A Gemma (model_type gemma) as transformers'
// GemmaModel computes it: norms by (1 + w), embeddings times sqrt(hidden_size), the tanh-GELU
// gate; with `ggml_gelu`, llama.cpp's table GELU instead. A Gemma 2 as transformers'
// Gemma2Model: Gemma's, with post_attention_layernorm on the attention output and
// pre_/post_feedforward_layernorm around the MLP, scores scaled by query_pre_attn_scalar^-1/2 and
// capped to cap tanh(s / cap), the sliding_attention layers' keys within sliding_window, and the
// logits capped by final_logit_softcapping.
std::vector<std::vector<double>> reference_logprobs(const ModelConfig& c, const TensorMap& params,
                                                    const std::vector<int32_t>& ids,
                                                    gguf::FileType type, bool act,
                                                    double perturb = 0, bool ggml_gelu = false) {
  // Gemma 3 (text) computes as Gemma 2 with (1 + w) q/k norms, the local layers' RoPE base and
  // no caps.
  const bool gemma2 = c.model_type == "gemma2" || c.model_type == "gemma3_text";
  const bool gemma = c.model_type == "gemma" || gemma2;
  const int64_t T = int64_t(ids.size()), D = c.hidden_size, H = c.num_attention_heads,
                KV = c.num_key_value_heads, hd = c.head_dim;
  auto W = [&](const std::string& n) { return params.at(n).data<float>(); };
  auto mm = [&](const std::string& n, std::vector<double> x) {
    const Tensor& w = params.at(n);
    const int64_t out = w.dim(0), in = w.dim(1);
    if (act) {
      for (double& e : x) e *= 1 + perturb;
      round_activations(gguf::tensor_type_for(type, n, w.shape(), c.tie_word_embeddings), x);
    }
    std::vector<double> y(static_cast<size_t>(out), 0.0);
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i)
        y[size_t(o)] += double(w.data<float>()[o * in + i]) * x[size_t(i)];
    return y;
  };
  auto rmsnorm = [&](const std::vector<double>& x, const std::string& n) {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double r = 1.0 / std::sqrt(ss / double(x.size()) + c.rms_norm_eps);
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * r * ((gemma ? 1.0 : 0.0) + double(W(n)[i]));
    return y;
  };
  // Qwen3's q/k norms: each head's slice RMS-normalized with the [hd] weight `n`.
  auto head_rmsnorm = [&](std::vector<double>& v, int64_t heads, const std::string& n) {
    for (int64_t h = 0; h < heads; ++h) {
      double ss = 0;
      for (int64_t i = 0; i < hd; ++i) ss += v[size_t(h * hd + i)] * v[size_t(h * hd + i)];
      const double r = 1.0 / std::sqrt(ss / double(hd) + c.rms_norm_eps);
      for (int64_t i = 0; i < hd; ++i) v[size_t(h * hd + i)] *= r * ((gemma ? 1.0 : 0.0) + W(n)[i]);
    }
  };
  // Phi-3's LongRoPE (transformers' _compute_longrope_parameters): each frequency divided by
  // its long factor when the sequence is longer than original_max_position_embeddings (else its
  // short one), cos and sin scaled by attention_factor.
  const auto& rs = c.rope_scaling;
  const bool longrope = rs.rope_type == "longrope";
  const std::vector<double>& ext =
      T > rs.original_max_position_embeddings ? rs.long_factor : rs.short_factor;
  const double mscale = longrope ? rs.attention_factor : 1.0;
  auto rope = [&](std::vector<double>& v, int64_t heads, int64_t pos, double base) {
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < hd / 2; ++i) {
        const double a = double(pos) * std::pow(base, -2.0 * double(i) / double(hd)) /
                         (longrope ? ext[size_t(i)] : 1.0);
        double& x0 = v[size_t(h * hd + i)];
        double& x1 = v[size_t(h * hd + i + hd / 2)];
        const double n0 = mscale * (x0 * std::cos(a) - x1 * std::sin(a)),
                     n1 = mscale * (x1 * std::cos(a) + x0 * std::sin(a));
        x0 = n0;
        x1 = n1;
      }
  };
  const std::string head = c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  std::vector<std::vector<double>> h(static_cast<size_t>(T),
                                     std::vector<double>(static_cast<size_t>(D)));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < D; ++i)
      h[size_t(t)][size_t(i)] = W("model.embed_tokens.weight")[ids[size_t(t)] * D + i] *
                                (gemma ? std::sqrt(double(D)) : 1.0);
  const double qk_scale = 1.0 / std::sqrt(gemma2 ? c.query_pre_attn_scalar : double(c.head_dim));
  auto softcap = [](double x, double cap) { return cap > 0 ? cap * std::tanh(x / cap) : x; };
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const bool local = !c.layer_types.empty() && c.layer_types[size_t(l)] == "sliding_attention";
    std::vector<std::vector<double>> q(static_cast<size_t>(T)), k(static_cast<size_t>(T)),
        v(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      const auto x = rmsnorm(h[size_t(t)], p + "input_layernorm.weight");
      q[size_t(t)] = mm(p + "self_attn.q_proj.weight", x);
      k[size_t(t)] = mm(p + "self_attn.k_proj.weight", x);
      v[size_t(t)] = mm(p + "self_attn.v_proj.weight", x);
      if (params.count(p + "self_attn.q_norm.weight")) {
        head_rmsnorm(q[size_t(t)], H, p + "self_attn.q_norm.weight");
        head_rmsnorm(k[size_t(t)], KV, p + "self_attn.k_norm.weight");
      }
      // Gemma 3's local layers rotate by rope_local_base_freq.
      const double base =
          local && c.rope_local_base_freq > 0 ? c.rope_local_base_freq : c.rope_theta;
      rope(q[size_t(t)], H, t, base);
      rope(k[size_t(t)], KV, t, base);
    }
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> att(size_t(H * hd), 0.0);
      for (int64_t hh = 0; hh < H; ++hh) {
        const int64_t kh = hh / (H / KV);
        std::vector<double> s(static_cast<size_t>(t + 1));
        double mx = -1e300, sum = 0;
        // A local layer's query sees its last sliding_window keys.
        const int64_t u0 = local ? std::max<int64_t>(0, t - c.sliding_window + 1) : 0;
        for (int64_t u = u0; u <= t; ++u) {
          double dot = 0;
          for (int64_t i = 0; i < hd; ++i)
            dot += q[size_t(t)][size_t(hh * hd + i)] * k[size_t(u)][size_t(kh * hd + i)];
          s[size_t(u)] = softcap(dot * qk_scale, c.attn_logit_softcapping);
          mx = std::max(mx, s[size_t(u)]);
        }
        for (int64_t u = u0; u <= t; ++u) sum += (s[size_t(u)] = std::exp(s[size_t(u)] - mx));
        for (int64_t u = u0; u <= t; ++u)
          for (int64_t i = 0; i < hd; ++i)
            att[size_t(hh * hd + i)] += s[size_t(u)] / sum * v[size_t(u)][size_t(kh * hd + i)];
      }
      auto o = mm(p + "self_attn.o_proj.weight", att);
      if (gemma2) o = rmsnorm(o, p + "post_attention_layernorm.weight");
      for (int64_t i = 0; i < D; ++i) h[size_t(t)][size_t(i)] += o[size_t(i)];
      const auto x = rmsnorm(h[size_t(t)], p + (gemma2 ? "pre_feedforward_layernorm.weight"
                                                       : "post_attention_layernorm.weight"));
      const auto g = mm(p + "mlp.gate_proj.weight", x), up = mm(p + "mlp.up_proj.weight", x);
      std::vector<double> a(g.size());
      for (size_t i = 0; i < g.size(); ++i)
        a[i] = (!gemma      ? g[i] / (1 + std::exp(-g[i]))
                : ggml_gelu ? ggml_gelu_table(g[i])
                            : gelu_tanh(g[i])) *
               up[i];
      auto dn = mm(p + "mlp.down_proj.weight", a);
      if (gemma2) dn = rmsnorm(dn, p + "post_feedforward_layernorm.weight");
      for (int64_t i = 0; i < D; ++i) h[size_t(t)][size_t(i)] += dn[size_t(i)];
    }
  }
  std::vector<std::vector<double>> out;
  for (int64_t t = 0; t < T; ++t) {
    auto lg = mm(head, rmsnorm(h[size_t(t)], "model.norm.weight"));
    for (double& e : lg) e = softcap(e, c.final_logit_softcapping);
    double mx = -1e300, s = 0;
    for (double e : lg) mx = std::max(mx, e);
    for (double e : lg) s += std::exp(e - mx);
    for (double& e : lg) e = e - mx - std::log(s);
    out.push_back(std::move(lg));
  }
  return out;
}

// F16 / quantized: llama.cpp also rounds the activations (round_activations). The independent
// reference with that rounding comes closer; what remains is at the noise floor of the
// rounding itself: a 1e-6 relative change of the activations (a different summation order)
// flips some roundings and moves the log-probabilities as much. `params`: the weights the file
// holds; `d`, `nll_ft`: fusetune on them against llama.cpp.
// ggml_gelu: the reference applies llama.cpp's table GELU (the Gemmas).
void expect_quantized_agreement(const ModelConfig& c, const TensorMap& params,
                                const std::vector<int32_t>& ids, gguf::FileType type,
                                const nlohmann::json& cpp, const Diff& d, double nll_cpp,
                                double nll_ft, bool ggml_gelu = false) {
  const auto ref_act = reference_logprobs(c, params, ids, type, true, 0, ggml_gelu);
  const auto ref_noise = reference_logprobs(c, params, ids, type, true, 1e-6, ggml_gelu);
  const Diff da = compare(ref_act, cpp["logprobs"]);
  const Diff noise = compare(ref_act, nlohmann::json(ref_noise));
  const double nll_act = mean_nll(ref_act, ids);
  std::printf(
      "[gguf %s %s] reference with llama.cpp's activation rounding vs llama.cpp: |dlogp| "
      "max %.3g, mean %.3g, mean NLL %.6f; its own 1e-6 noise floor: max %.3g, mean "
      "%.3g\n",
      c.model_type.c_str(), gguf::file_type_name(type), da.max_abs, da.mean_abs, nll_act,
      noise.max_abs, noise.mean_abs);
  // A tiny model whose activations the 1e-6 change rounds no differently has a floor of 0:
  // there the reference must agree as closely as an F32 export does.
  EXPECT_LT(da.mean_abs, std::max(1.5 * noise.mean_abs, 1e-4));
  if (type == gguf::FileType::F16) {
    // fp16 activations or not cannot be told apart here: both are at the noise floor.
    EXPECT_LT(d.mean_abs, 0.005);
    EXPECT_LT(std::fabs(nll_cpp - nll_ft), 5e-4);
    return;
  }
  EXPECT_LT(d.mean_abs, 0.05);
  EXPECT_LT(da.mean_abs, d.mean_abs);
  EXPECT_LT(std::fabs(nll_cpp - nll_ft), 0.005);
}

}  // namespace

TEST(GgufLlamaCpp, Stories260KLogitsAgreeWithFusetune) {
  FT_REQUIRE_ASSET("stories260K/model.safetensors");
  FT_REQUIRE_ASSET("datasets/tinystories_sample.txt");
  if (auto why = llama_cpp_unavailable(); !why.empty()) FT_SKIP_UNLESS_REQUIRED(why);
  fusetune::testing::TempDir tmp;
  const fs::path dir = fusetune::testing::assets_dir() / "stories260K";
  const HFCheckpoint ck = load_hf_checkpoint(dir);
  auto tok = HfTokenizer::from_file(dir / "tokenizer.json");
  std::ifstream story_in(fusetune::testing::assets_dir() / "datasets" / "tinystories_sample.txt");
  std::string story(std::istreambuf_iterator<char>(story_in), {});
  story = story.substr(story.find("Once"), story.find("<|endoftext|>") - story.find("Once"));
  while (!story.empty() && (story.back() == '\n' || story.back() == ' ')) story.pop_back();
  std::vector<int32_t> ids = tok->encode(story, true, false);
  ids.resize(std::min<size_t>(ids.size(), 128));

  TensorMap orig;
  for (const auto& [name, t] : ck.tensors) orig[name] = t;
  const auto lp_fp32 = fusetune_logprobs(ck.config, orig, ids);
  const double nll_fp32 = mean_nll(lp_fp32, ids);

  for (const auto type :
       {gguf::FileType::F32, gguf::FileType::F16, gguf::FileType::Q8_0, gguf::FileType::Q4_0}) {
    SCOPED_TRACE(gguf::file_type_name(type));
    const fs::path file =
        tmp / (std::string("stories260K-") + gguf::file_type_name(type) + ".gguf");
    gguf::export_gguf(dir, file, type);
    const auto cpp = run_llama_cpp(file, ids, story, tmp.path());
    ASSERT_EQ(cpp["logprobs"].size(), ids.size());
    // llama.cpp tokenizes with the GGUF's tokenizer.ggml.* exactly as fusetune does.
    EXPECT_EQ(cpp["text_tokens"].get<std::vector<int32_t>>(), tok->encode(story, false, false));

    // fusetune on the weights the file holds (what `fusetune quantize` writes).
    TensorMap params;
    std::vector<Tensor> keep;
    for (const auto& [name, shape] : expected_parameters(ck.config)) {
      Tensor t = Tensor::empty(shape, DType::F32);
      const Tensor& src = ck.tensors.at(name);
      std::copy(src.data<float>(), src.data<float>() + src.numel(), t.data<float>());
      gguf::fake_quantize(gguf::tensor_type_for(type, name, shape, ck.config.tie_word_embeddings),
                          t.data<float>(), t.numel());
      params[name] = t;
    }
    const auto lp = fusetune_logprobs(ck.config, params, ids);
    std::vector<std::vector<double>> cpp_lp;
    for (const auto& row : cpp["logprobs"]) cpp_lp.push_back(row.get<std::vector<double>>());
    const Diff d = compare(lp, cpp["logprobs"]);
    const double nll_ft = mean_nll(lp, ids), nll_cpp = mean_nll(cpp_lp, ids);
    std::printf(
        "[gguf %s] %zu tokens, llama.cpp vs fusetune on the same weights: |dlogp| max "
        "%.3g (rel %.3g), mean %.3g; mean NLL llama.cpp %.6f, fusetune %.6f, fp32 %.6f\n",
        gguf::file_type_name(type), ids.size(), d.max_abs, d.max_rel, d.mean_abs, nll_cpp, nll_ft,
        nll_fp32);
    if (type == gguf::FileType::F32) {
      EXPECT_LT(d.max_rel, 1e-4);
      EXPECT_NEAR(nll_cpp, nll_ft, 1e-5);
      continue;
    }
    expect_quantized_agreement(ck.config, params, ids, type, cpp, d, nll_cpp, nll_ft);
    if (type == gguf::FileType::Q4_0) {  // fusetune predicts most of Q4_0's loss increase
      EXPECT_LT(std::fabs(nll_cpp - nll_ft), 0.25 * (nll_cpp - nll_fp32));
    }
  }
}

// Byte-level BPE tokenizers (Llama 3, Qwen3, GPT-2) exported as tokenizer.ggml.* ("gpt2" with
// the pre-tokenizer name), and Llama 2's SentencePiece tokenizer.model ("llama"), into a tiny
// model: llama.cpp's tokenizer, reading only the GGUF, encodes the tokenizer test corpus to the
// same ids as fusetune (which the tokenizer conformance tests check against Hugging Face's own
// library).
TEST(GgufLlamaCpp, TokenizersEncodeAsFusetune) {
  if (auto why = llama_cpp_unavailable(); !why.empty()) FT_SKIP_UNLESS_REQUIRED(why);
  std::vector<std::string> corpus;
  {
    std::ifstream in(fs::path(fusetune::testing::test_data_dir()) / "tokenizer_corpus.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      const auto v = nlohmann::json::parse(line);
      const std::string t = v.is_string() ? v.get<std::string>() : v.at("text").get<std::string>();
      if (!t.empty() && t.find("<|") == std::string::npos) corpus.push_back(t);  // no specials
    }
  }
  fusetune::testing::TempDir tmp;
  std::ofstream(tmp / "texts.json") << nlohmann::json(corpus).dump();
  for (const auto& [name, pre] : {std::pair{"llama3", "llama-bpe"}, std::pair{"qwen3", "qwen2"},
                                  std::pair{"gpt2", "gpt-2"}, std::pair{"llama2", "(spm)"}}) {
    SCOPED_TRACE(name);
    const fs::path src = fusetune::testing::assets_dir() / "tokenizers" / name;
    const bool spm = std::string(name) == "llama2";
    const std::vector<std::string> files =
        spm ? std::vector<std::string>{"tokenizer.model"}
            : std::vector<std::string>{"tokenizer.json", "tokenizer_config.json"};
    if (!fs::exists(src / files[0])) {
      FT_SKIP_UNLESS_REQUIRED("asset tokenizers/" + std::string(name) + " not found");
    }
    std::unique_ptr<Tokenizer> tok;
    if (spm) {
      tok = SentencePieceTokenizer::from_file(src / files[0]);
    } else {
      tok = HfTokenizer::from_file(src / files[0]);
    }
    ModelConfig c;
    c.vocab_size = tok->vocab_size();
    c.hidden_size = 32;
    c.intermediate_size = 32;
    c.num_hidden_layers = 1;
    c.num_attention_heads = 2;
    c.num_key_value_heads = 2;
    c.head_dim = 16;
    c.tie_word_embeddings = true;
    NamedTensors ts;
    for (const auto& [pname, shape] : expected_parameters(c)) {
      Tensor t = Tensor::empty(shape, DType::F32);
      for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float((i * 7919) % 13) * 0.01f;
      ts.push_back({pname, t});
    }
    const fs::path ck = tmp / name;
    save_hf_checkpoint(ck, c, ts);
    for (const auto& f : files) fs::copy_file(src / f, ck / f);
    const fs::path file = tmp / (std::string(name) + ".gguf");
    gguf::export_gguf(ck, file, gguf::FileType::Q8_0);

    const fs::path out = tmp / "tok.json", log = tmp / "tok.log";
    const std::string cmd = "node '" + (ref_dir() / "logits.mjs").string() + "' --model '" +
                            file.string() + "' --texts '" + (tmp / "texts.json").string() + "' >'" +
                            out.string() + "' 2>'" + log.string() + "'";
    if (std::system(cmd.c_str()) != 0) {
      std::ifstream in(log);
      FAIL() << cmd << "\n" << std::string(std::istreambuf_iterator<char>(in), {});
    }
    const auto j = nlohmann::json::parse(std::ifstream(out));
    ASSERT_EQ(j["texts_tokens"].size(), corpus.size());
    // llama.cpp applies no tokenizer.json normalizer: Qwen3's NFC is not in the GGUF, so
    // strings NFC changes are left out for it (and counted).
    const bool nfc = std::string(name) == "qwen3";
    size_t same = 0, compared = 0;
    std::string first_diff;
    for (size_t i = 0; i < corpus.size(); ++i) {
      if (nfc && unicode::normalize(corpus[i], unicode::NormalForm::NFC) != corpus[i]) continue;
      if (spm && corpus[i].find("<") != std::string::npos) continue;  // <s> etc. are ids in ours
      ++compared;
      const auto want = tok->encode(corpus[i], false, false);
      if (j["texts_tokens"][i].get<std::vector<int32_t>>() == want) {
        ++same;
      } else {
        if (first_diff.empty()) first_diff = nlohmann::json(corpus[i]).dump();
      }
    }
    std::printf(
        "[gguf tokenizer %s, pre %s] llama.cpp encodes %zu of %zu corpus strings as "
        "fusetune (%zu left out: NFC changes them, or <s>-like text for SentencePiece)%s%s\n",
        name, pre, same, compared, corpus.size() - compared,
        first_diff.empty() ? "" : "; first difference: ", first_diff.c_str());
    EXPECT_EQ(same, compared) << "first difference: " << first_diff;
  }
}

// A model of hidden size 256 (random weights, stories260K's tokenizer) exported as Q4_0: its
// head (untied: output.weight; tied: token_embd.weight) is Q6_K, as llama-quantize makes it.
// llama.cpp's log-probabilities against fusetune's QAT evaluation (gguf_q4_0: the head
// fake-quantized as Q6_K on Q8_K activations) and against fusetune on the fake-quantized
// weights; with the head fake-quantized as Q8_0 instead (fusetune's former deviation) the
// prediction is measurably farther from llama.cpp.
TEST(GgufLlamaCpp, Hidden256Q4_0HeadIsQ6_KAndFusetunePredictsLlamaCpp) {
  FT_REQUIRE_ASSET("stories260K/tokenizer.json");
  FT_REQUIRE_ASSET("datasets/tinystories_sample.txt");
  if (auto why = llama_cpp_unavailable(); !why.empty()) FT_SKIP_UNLESS_REQUIRED(why);
  const fs::path src = fusetune::testing::assets_dir() / "stories260K";
  auto tok = HfTokenizer::from_file(src / "tokenizer.json");
  std::ifstream story_in(fusetune::testing::assets_dir() / "datasets" / "tinystories_sample.txt");
  std::string story(std::istreambuf_iterator<char>(story_in), {});
  story = story.substr(story.find("Once"), story.find("<|endoftext|>") - story.find("Once"));
  while (!story.empty() && (story.back() == '\n' || story.back() == ' ')) story.pop_back();
  std::vector<int32_t> ids = tok->encode(story, true, false);
  ids.resize(std::min<size_t>(ids.size(), 64));
  const HFCheckpoint base = load_hf_checkpoint(src);

  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    fusetune::testing::TempDir tmp;
    ModelConfig c = base.config;
    c.hidden_size = 256;
    c.intermediate_size = 512;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 64;
    c.tie_word_embeddings = tied;
    // Weights that give the logits a spread of a few nats (the head's rows ~ N(0, 0.15^2)).
    std::mt19937 rng(tied ? 17 : 16);
    NamedTensors ts;
    for (const auto& [name, shape] : expected_parameters(c)) {
      Tensor t = Tensor::empty(shape, DType::F32);
      const bool norm = shape.size() == 1;
      const bool table = name == "model.embed_tokens.weight" || name == "lm_head.weight";
      std::normal_distribution<float> n(norm ? 1.0f : 0.0f, norm ? 0.1f : table ? 0.15f : 0.06f);
      for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = n(rng);
      ts.push_back({name, t});
    }
    const fs::path ck = tmp / "ck";
    save_hf_checkpoint(ck, c, ts);
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"})
      if (fs::exists(src / f)) fs::copy_file(src / f, ck / f);
    const fs::path file = tmp / "h256-q4_0.gguf";
    const auto r = gguf::export_gguf(ck, file, gguf::FileType::Q4_0);
    const std::string head_gguf = tied ? "token_embd.weight" : "output.weight";
    const std::string head = tied ? "model.embed_tokens.weight" : "lm_head.weight";
    for (const auto& [name, type] : r.tensors)
      if (name == head_gguf) {
        EXPECT_EQ(type, gguf::TensorType::Q6_K);
      }
    const auto cpp = run_llama_cpp(file, ids, story, tmp.path());
    ASSERT_EQ(cpp["logprobs"].size(), ids.size());

    // fusetune's QAT evaluation (fake quantization always on) on the float weights.
    TensorMap orig;
    for (const auto& [name, t] : ts) orig[name] = t;
    quant::QatConfig q;
    q.scheme = quant::QatScheme::GgufQ4_0;
    const auto lp_qat = fusetune_logprobs(
        c, orig, ids, quant::qat_llama_options(q, std::make_shared<ModelConfig>(c), false));
    // fusetune on the weights the file holds, and with the head fake-quantized as Q8_0 instead.
    auto weights = [&](bool q8_head) {
      TensorMap params;
      for (const auto& [name, shape] : expected_parameters(c)) {
        Tensor t = Tensor::empty(shape, DType::F32);
        std::copy(orig.at(name).data<float>(), orig.at(name).data<float>() + t.numel(),
                  t.data<float>());
        gguf::TensorType type = gguf::tensor_type_for(gguf::FileType::Q4_0, name, shape, tied);
        if (q8_head && name == head) type = gguf::TensorType::Q8_0;
        gguf::fake_quantize(type, t.data<float>(), t.numel());
        params[name] = t;
      }
      return params;
    };
    const TensorMap wq = weights(false), wq8 = weights(true);
    const auto lp_w = fusetune_logprobs(c, wq, ids), lp_w8 = fusetune_logprobs(c, wq8, ids);
    const auto ref_act = reference_logprobs(c, wq, ids, gguf::FileType::Q4_0, true);
    const auto ref_noise = reference_logprobs(c, wq, ids, gguf::FileType::Q4_0, true, 1e-6);
    const Diff d_qat = compare(lp_qat, cpp["logprobs"]), d_w = compare(lp_w, cpp["logprobs"]),
               d_w8 = compare(lp_w8, cpp["logprobs"]), d_act = compare(ref_act, cpp["logprobs"]),
               noise = compare(ref_act, nlohmann::json(ref_noise));
    std::vector<std::vector<double>> cpp_lp;
    for (const auto& row : cpp["logprobs"]) cpp_lp.push_back(row.get<std::vector<double>>());
    std::printf(
        "[gguf q4_0 hidden 256 %s, Q6_K head] %zu tokens, llama.cpp vs: fusetune QAT eval "
        "|dlogp| max %.3g mean %.3g; fusetune on the file's weights max %.3g mean %.3g; the "
        "same with a Q8_0 head max %.3g mean %.3g; reference with llama.cpp's activation "
        "rounding (Q8_K at the head) max %.3g mean %.3g (its 1e-6 noise floor max %.3g mean "
        "%.3g); mean NLL llama.cpp %.6f, QAT eval %.6f, Q8_0-head %.6f\n",
        tied ? "tied" : "untied", ids.size(), d_qat.max_abs, d_qat.mean_abs, d_w.max_abs,
        d_w.mean_abs, d_w8.max_abs, d_w8.mean_abs, d_act.max_abs, d_act.mean_abs, noise.max_abs,
        noise.mean_abs, mean_nll(cpp_lp, ids), mean_nll(lp_qat, ids), mean_nll(lp_w8, ids));
    EXPECT_LT(d_act.mean_abs, 1.5 * noise.mean_abs);  // llama.cpp computes what we think it does
    EXPECT_LT(d_w.mean_abs, d_w8.mean_abs);           // the Q6_K head is what llama.cpp runs
    EXPECT_LT(d_qat.mean_abs, d_w8.mean_abs);
    EXPECT_LT(d_qat.mean_abs, 0.05);
  }
}

namespace {

// A random Qwen3 (model_type qwen3: q/k norms before RoPE, head_dim 32 independent of
// hidden_size 64 / 4 heads, tied embeddings, NEOX RoPE without permutation) saved with Qwen3's
// own tokenizer, and 16 positions of a story in it (each row compares all 151,936
// log-probabilities: node's JSON of them is most of these tests' time).
struct RandomQwen3 {
  ModelConfig c;
  TensorMap params;
  fs::path dir;
  std::string story;
  std::vector<int32_t> text_ids, ids;
};

RandomQwen3 random_qwen3(const fs::path& tmp) {
  RandomQwen3 q;
  const fs::path src = fusetune::testing::assets_dir() / "tokenizers" / "qwen3";
  auto tok = HfTokenizer::from_file(src / "tokenizer.json");
  std::ifstream story_in(fusetune::testing::assets_dir() / "datasets" / "tinystories_sample.txt");
  std::string story(std::istreambuf_iterator<char>(story_in), {});
  story = story.substr(story.find("Once"), story.find("<|endoftext|>") - story.find("Once"));
  while (!story.empty() && (story.back() == '\n' || story.back() == ' ')) story.pop_back();
  q.story = story;
  q.text_ids = tok->encode(story, false, false);
  q.ids.assign(q.text_ids.begin(), q.text_ids.begin() + 16);
  q.c = parse_model_config(nlohmann::json{{"model_type", "qwen3"},
                                          {"vocab_size", 151936},
                                          {"hidden_size", 64},
                                          {"intermediate_size", 128},
                                          {"num_hidden_layers", 2},
                                          {"num_attention_heads", 4},
                                          {"num_key_value_heads", 2},
                                          {"head_dim", 32},
                                          {"rope_theta", 1000000.0},
                                          {"rms_norm_eps", 1e-6},
                                          {"tie_word_embeddings", true},
                                          {"eos_token_id", 151645}},
                           "qwen3 test config");
  std::mt19937 rng(3);
  NamedTensors ts;
  for (const auto& [name, shape] : expected_parameters(q.c)) {
    Tensor t = Tensor::empty(shape, DType::F32);
    const bool norm = shape.size() == 1;
    std::normal_distribution<float> n(norm ? 1.0f : 0.0f, norm ? 0.2f : 0.08f);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = n(rng);
    ts.push_back({name, t});
    q.params[name] = t;
  }
  q.dir = tmp / "qwen3";
  save_hf_checkpoint(q.dir, q.c, ts);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(src / f, q.dir / f);
  return q;
}

}  // namespace

// The random Qwen3 exported as F32 GGUF (architecture qwen3): llama.cpp's log-probabilities
// agree with fusetune's evaluation and with the independent double-precision forward written
// out above (which applies the q/k norms itself), as the Llama F32 export does.
TEST(GgufLlamaCpp, Qwen3F32LogitsAgreeWithFusetuneAndTheReference) {
  FT_REQUIRE_ASSET("tokenizers/qwen3/tokenizer.json");
  FT_REQUIRE_ASSET("datasets/tinystories_sample.txt");
  if (auto why = llama_cpp_unavailable(); !why.empty()) FT_SKIP_UNLESS_REQUIRED(why);
  fusetune::testing::TempDir tmp;
  const RandomQwen3 q = random_qwen3(tmp.path());
  const ModelConfig& c = q.c;
  const std::vector<int32_t>& ids = q.ids;
  ASSERT_TRUE(q.params.count("model.layers.1.self_attn.k_norm.weight"));
  const fs::path file = tmp / "qwen3-f32.gguf";
  const auto r = gguf::export_gguf(q.dir, file, gguf::FileType::F32);
  int norms = 0;
  for (const auto& [name, type] : r.tensors)
    norms += name.find("attn_q_norm") != std::string::npos ||
             name.find("attn_k_norm") != std::string::npos;
  EXPECT_EQ(norms, 4);
  const auto cpp = run_llama_cpp(file, ids, q.story, tmp.path());
  ASSERT_EQ(cpp["logprobs"].size(), ids.size());
  EXPECT_EQ(cpp["text_tokens"].get<std::vector<int32_t>>(), q.text_ids);

  const auto lp = fusetune_logprobs(c, q.params, ids);
  const auto ref = reference_logprobs(c, q.params, ids, gguf::FileType::F32, false);
  std::vector<std::vector<double>> cpp_lp;
  for (const auto& row : cpp["logprobs"]) cpp_lp.push_back(row.get<std::vector<double>>());
  const Diff d = compare(lp, cpp["logprobs"]), d_ref = compare(ref, cpp["logprobs"]),
             d_ft = compare(lp, nlohmann::json(ref));
  const double nll_ft = mean_nll(lp, ids), nll_cpp = mean_nll(cpp_lp, ids);
  std::printf(
      "[gguf qwen3 f32] %zu tokens, |dlogp| llama.cpp vs fusetune max %.3g (rel %.3g) mean %.3g, "
      "llama.cpp vs reference max %.3g, fusetune vs reference max %.3g; mean NLL llama.cpp %.6f, "
      "fusetune %.6f\n",
      ids.size(), d.max_abs, d.max_rel, d.mean_abs, d_ref.max_abs, d_ft.max_abs, nll_cpp, nll_ft);
  EXPECT_LT(d.max_rel, 1e-4);
  EXPECT_NEAR(nll_cpp, nll_ft, 1e-5);
  EXPECT_LT(d_ft.max_rel, 1e-4);
  EXPECT_GT(nll_ft, 1.0);  // the logits have a spread: a wrong norm would show
}

// The random Qwen3 exported as Q8_0 and Q4_0 (the q/k norms stay F32, the tied head Q8_0 at
// this width): llama.cpp agrees with fusetune on the weights the file holds, and with the
// reference that rounds the activations as llama.cpp does, to the quantized stories260K
// export's bounds (expect_quantized_agreement).
TEST(GgufLlamaCpp, Qwen3QuantizedLogitsAgreeWithFusetuneOnTheFilesWeights) {
  FT_REQUIRE_ASSET("tokenizers/qwen3/tokenizer.json");
  FT_REQUIRE_ASSET("datasets/tinystories_sample.txt");
  if (auto why = llama_cpp_unavailable(); !why.empty()) FT_SKIP_UNLESS_REQUIRED(why);
  fusetune::testing::TempDir tmp;
  const RandomQwen3 q = random_qwen3(tmp.path());
  for (const auto type : {gguf::FileType::Q8_0, gguf::FileType::Q4_0}) {
    SCOPED_TRACE(gguf::file_type_name(type));
    const fs::path file = tmp / (std::string("qwen3-") + gguf::file_type_name(type) + ".gguf");
    const auto r = gguf::export_gguf(q.dir, file, type);
    int quantized = 0;
    const auto want =
        type == gguf::FileType::Q8_0 ? gguf::TensorType::Q8_0 : gguf::TensorType::Q4_0;
    for (const auto& [name, t] : r.tensors)
      quantized += name.find("ffn") != std::string::npos && t == want;
    EXPECT_EQ(quantized, 6);  // ffn_gate, ffn_up, ffn_down of both layers
    TensorMap params;         // what the file holds
    for (const auto& [name, shape] : expected_parameters(q.c)) {
      Tensor t = Tensor::empty(shape, DType::F32);
      const Tensor& src = q.params.at(name);
      std::copy(src.data<float>(), src.data<float>() + src.numel(), t.data<float>());
      gguf::fake_quantize(gguf::tensor_type_for(type, name, shape, q.c.tie_word_embeddings),
                          t.data<float>(), t.numel());
      params[name] = t;
    }
    const auto cpp = run_llama_cpp(file, q.ids, q.story, tmp.path());
    ASSERT_EQ(cpp["logprobs"].size(), q.ids.size());
    const auto lp = fusetune_logprobs(q.c, params, q.ids);
    std::vector<std::vector<double>> cpp_lp;
    for (const auto& row : cpp["logprobs"]) cpp_lp.push_back(row.get<std::vector<double>>());
    const Diff d = compare(lp, cpp["logprobs"]);
    const double nll_ft = mean_nll(lp, q.ids), nll_cpp = mean_nll(cpp_lp, q.ids);
    std::printf(
        "[gguf qwen3 %s] %zu tokens, llama.cpp vs fusetune on the file's weights: |dlogp| max "
        "%.3g (rel %.3g), mean %.3g; mean NLL llama.cpp %.6f, fusetune %.6f\n",
        gguf::file_type_name(type), q.ids.size(), d.max_abs, d.max_rel, d.mean_abs, nll_cpp,
        nll_ft);
    expect_quantized_agreement(q.c, params, q.ids, type, cpp, d, nll_cpp, nll_ft);
  }
}

namespace {

// The Gemma families' check: random weights (stored norm weights around 0, for (1 + w)),
// fusetune against the double reference, then the F32 GGUF in llama.cpp against the reference
// with llama.cpp's table GELU.
struct StoryText {
  fs::path src;  // stories260K: the tokenizer files
  std::unique_ptr<HfTokenizer> tok;
  std::string story;
  std::vector<int32_t> ids;
};

StoryText story_text(size_t tokens) {
  StoryText s;
  s.src = fusetune::testing::assets_dir() / "stories260K";
  s.tok = HfTokenizer::from_file(s.src / "tokenizer.json");
  std::ifstream story_in(fusetune::testing::assets_dir() / "datasets" / "tinystories_sample.txt");
  std::string story(std::istreambuf_iterator<char>(story_in), {});
  story = story.substr(story.find("Once"), story.find("<|endoftext|>") - story.find("Once"));
  while (!story.empty() && (story.back() == '\n' || story.back() == ' ')) story.pop_back();
  s.ids = s.tok->encode(story, true, false);
  s.ids.resize(tokens);
  s.story = story;
  return s;
}

// The checkpoint `ck` of `c` (float weights `params`) also exported as Q8_0 and Q4_0: llama.cpp
// agrees with fusetune on the weights each file holds, and with the reference (`ref_config` on
// reference_params(those weights), rounding the activations as llama.cpp does), to the
// quantized stories260K export's bounds.
void check_quantized_exports(const ModelConfig& c, const TensorMap& params, const fs::path& ck,
                             const StoryText& text, const fs::path& tmp,
                             const ModelConfig& ref_config,
                             const std::function<TensorMap(const TensorMap&)>& reference_params,
                             bool ggml_gelu) {
  for (const auto type : {gguf::FileType::Q8_0, gguf::FileType::Q4_0}) {
    SCOPED_TRACE(gguf::file_type_name(type));
    const fs::path file = tmp / (c.model_type + "-" + gguf::file_type_name(type) + ".gguf");
    gguf::export_gguf(ck, file, type);
    TensorMap q;  // what the file holds
    for (const auto& [name, shape] : expected_parameters(c)) {
      Tensor t = Tensor::empty(shape, DType::F32);
      const Tensor& src = params.at(name);
      std::copy(src.data<float>(), src.data<float>() + src.numel(), t.data<float>());
      gguf::fake_quantize(gguf::tensor_type_for(type, name, shape, c.tie_word_embeddings),
                          t.data<float>(), t.numel());
      q[name] = t;
    }
    const auto cpp = run_llama_cpp(file, text.ids, text.story, tmp);
    ASSERT_EQ(cpp["logprobs"].size(), text.ids.size());
    const auto lp = fusetune_logprobs(c, q, text.ids);
    std::vector<std::vector<double>> cpp_lp;
    for (const auto& row : cpp["logprobs"]) cpp_lp.push_back(row.get<std::vector<double>>());
    const Diff d = compare(lp, cpp["logprobs"]);
    const double nll_ft = mean_nll(lp, text.ids), nll_cpp = mean_nll(cpp_lp, text.ids);
    std::printf(
        "[gguf %s %s] %zu tokens, llama.cpp vs fusetune on the file's weights: |dlogp| max "
        "%.3g (rel %.3g), mean %.3g; mean NLL llama.cpp %.6f, fusetune %.6f\n",
        c.model_type.c_str(), gguf::file_type_name(type), text.ids.size(), d.max_abs, d.max_rel,
        d.mean_abs, nll_cpp, nll_ft);
    expect_quantized_agreement(ref_config, reference_params(q), text.ids, type, cpp, d, nll_cpp,
                               nll_ft, ggml_gelu);
  }
}

// cpp_rel: how far llama.cpp may be from the table-GELU reference (relative max |dlogp|).
void check_gemma_family(const ModelConfig& c, const char* tag, const StoryText& text,
                        double cpp_rel = 1e-4) {
  fusetune::testing::TempDir tmp;
  const fs::path& src = text.src;
  const auto& tok = text.tok;
  const std::string& story = text.story;
  const std::vector<int32_t>& ids = text.ids;
  std::mt19937 rng(5);
  NamedTensors ts;
  TensorMap params;
  for (const auto& [name, shape] : expected_parameters(c)) {
    Tensor t = Tensor::empty(shape, DType::F32);
    const bool norm = shape.size() == 1;  // stored w of a (1 + w) norm: around 0
    std::normal_distribution<float> n(0.0f, norm ? 0.3f : 0.1f);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = n(rng);
    ts.push_back({name, t});
    params[name] = t;
  }
  const auto lp = fusetune_logprobs(c, params, ids);
  const auto ref = reference_logprobs(c, params, ids, gguf::FileType::F32, false);
  const Diff d_ft = compare(lp, nlohmann::json(ref));
  const double nll_ft = mean_nll(lp, ids);
  std::printf("[%s f32] fusetune vs reference |dlogp| max %.3g (rel %.3g); mean NLL %.6f\n", tag,
              d_ft.max_abs, d_ft.max_rel, nll_ft);
  EXPECT_LT(d_ft.max_rel, 1e-5);
  EXPECT_GT(nll_ft, 1.0);  // the logits have a spread: a wrong norm would show

  if (auto why = llama_cpp_unavailable(); !why.empty()) FT_SKIP_UNLESS_REQUIRED(why);
  const fs::path ck = tmp / tag;
  save_hf_checkpoint(ck, c, ts);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) fs::copy_file(src / f, ck / f);
  const fs::path file = tmp / (std::string(tag) + "-f32.gguf");
  gguf::export_gguf(ck, file, gguf::FileType::F32);
  const auto cpp = run_llama_cpp(file, ids, story, tmp.path());
  ASSERT_EQ(cpp["logprobs"].size(), ids.size());
  EXPECT_EQ(cpp["text_tokens"].get<std::vector<int32_t>>(), tok->encode(story, false, false));
  const auto ref_table =
      reference_logprobs(c, params, ids, gguf::FileType::F32, false, 0, /*ggml_gelu=*/true);
  std::vector<std::vector<double>> cpp_lp;
  for (const auto& row : cpp["logprobs"]) cpp_lp.push_back(row.get<std::vector<double>>());
  const Diff d = compare(lp, cpp["logprobs"]), d_ref = compare(ref, cpp["logprobs"]),
             d_table = compare(ref_table, cpp["logprobs"]);
  const double nll_cpp = mean_nll(cpp_lp, ids), nll_table = mean_nll(ref_table, ids);
  // The table GELU rounds its input to fp16, so a summation order that moves a matmul's output
  // by one float rounding (llama.cpp's blocked FMA dot products against the double reference)
  // flips some of those fp16 roundings: the table reference's own floor, measured as the
  // quantized checks measure theirs, by a 1e-6 relative change of every matmul's input.
  const Diff floor =
      compare(ref_table, nlohmann::json(reference_logprobs(c, params, ids, gguf::FileType::F32,
                                                           true, 1e-6, /*ggml_gelu=*/true)));
  std::printf(
      "[gguf %s f32] %zu tokens, |dlogp| llama.cpp vs reference with its table GELU max %.3g "
      "(rel %.3g; the table's own 1e-6 noise floor: max %.3g, rel %.3g), vs the exact reference "
      "max %.3g, vs fusetune max %.3g (mean %.3g); mean NLL llama.cpp %.6f, table reference "
      "%.6f, fusetune %.6f\n",
      tag, ids.size(), d_table.max_abs, d_table.max_rel, floor.max_abs, floor.max_rel,
      d_ref.max_abs, d.max_abs, d.mean_abs, nll_cpp, nll_table, nll_ft);
  EXPECT_LT(d_table.max_rel, std::max(cpp_rel, 1.5 * floor.max_rel));
  EXPECT_NEAR(nll_cpp, nll_table, 1e-5);
  EXPECT_LT(d.max_rel, 1e-2);  // the fp16 GELU table's rounding, no more
  check_quantized_exports(
      c, params, ck, text, tmp.path(), c, [](const TensorMap& m) { return m; },
      /*ggml_gelu=*/true);
}

}  // namespace

// Gemma (model_type gemma: RMSNorm by (1 + w), embeddings times sqrt(hidden_size), the
// tanh-GELU gate, head_dim 32 apart from hidden_size 64 / 4 heads, one KV head (MQA), tied
// embeddings) with random weights and stories260K's tokenizer, exported as F32 GGUF
// (architecture gemma, norms written as 1 + w): fusetune agrees with the independent forward
// above (transformers' GemmaModel in double) without llama.cpp, and llama.cpp agrees with that
// forward once its table GELU (fp16 in, fp16 out) is applied there too; fusetune's exact GELU
// and llama.cpp's table stay within the table's rounding of each other.
TEST(GgufLlamaCpp, GemmaF32LogitsAgreeWithFusetuneAndTheReference) {
  FT_REQUIRE_ASSET("stories260K/tokenizer.json");
  FT_REQUIRE_ASSET("datasets/tinystories_sample.txt");
  const StoryText text = story_text(48);
  const ModelConfig c = parse_model_config(nlohmann::json{{"model_type", "gemma"},
                                                          {"vocab_size", 512},
                                                          {"hidden_size", 64},
                                                          {"intermediate_size", 128},
                                                          {"num_hidden_layers", 2},
                                                          {"num_attention_heads", 4},
                                                          {"num_key_value_heads", 1},
                                                          {"head_dim", 32},
                                                          {"rms_norm_eps", 1e-6},
                                                          {"hidden_act", "gelu"},
                                                          {"hidden_activation", kGeluTanh},
                                                          {"bos_token_id", 1},
                                                          {"eos_token_id", 2}},
                                           "gemma test config");
  ASSERT_TRUE(c.tie_word_embeddings);  // Gemma's default
  check_gemma_family(c, "gemma", text);
}

// Gemma 2 (model_type gemma2: Gemma's blocks with post-norms, attention scores capped at 0.5 and
// logits at 1.0 (both bend the random model's values), local layers 0 and 2 of 4 with a window
// of 8 over 48 tokens, GQA 4:2, head_dim 32 apart, query_pre_attn_scalar = head_dim as llama.cpp
// assumes) exported as GGUF gemma2: fusetune, the double reference and llama.cpp agree.
TEST(GgufLlamaCpp, Gemma2F32LogitsAgreeWithFusetuneAndTheReference) {
  FT_REQUIRE_ASSET("stories260K/tokenizer.json");
  FT_REQUIRE_ASSET("datasets/tinystories_sample.txt");
  const StoryText text = story_text(48);
  const ModelConfig c = parse_model_config(nlohmann::json{{"model_type", "gemma2"},
                                                          {"vocab_size", 512},
                                                          {"hidden_size", 64},
                                                          {"intermediate_size", 128},
                                                          {"num_hidden_layers", 4},
                                                          {"num_attention_heads", 4},
                                                          {"num_key_value_heads", 2},
                                                          {"head_dim", 32},
                                                          {"query_pre_attn_scalar", 32},
                                                          {"rms_norm_eps", 1e-6},
                                                          {"sliding_window", 8},
                                                          {"attn_logit_softcapping", 0.5},
                                                          {"final_logit_softcapping", 1.0},
                                                          {"hidden_activation", kGeluTanh},
                                                          {"bos_token_id", 1},
                                                          {"eos_token_id", 2}},
                                           "gemma2 test config");
  ASSERT_EQ(c.layer_types, (std::vector<std::string>{"sliding_attention", "full_attention",
                                                     "sliding_attention", "full_attention"}));
  check_gemma_family(c, "gemma2", text);
}

// Gemma 3 (model_type gemma3_text: Gemma 2's blocks with (1 + w) q/k norms, five local layers
// (window 8 over 48 tokens, RoPE base 10000) to a global one (rope_theta 1e6), no caps) exported
// as GGUF gemma3: fusetune, the double reference and llama.cpp agree.
TEST(GgufLlamaCpp, Gemma3F32LogitsAgreeWithFusetuneAndTheReference) {
  FT_REQUIRE_ASSET("stories260K/tokenizer.json");
  FT_REQUIRE_ASSET("datasets/tinystories_sample.txt");
  const StoryText text = story_text(48);
  const ModelConfig c = parse_model_config(nlohmann::json{{"model_type", "gemma3_text"},
                                                          {"vocab_size", 512},
                                                          {"hidden_size", 64},
                                                          {"intermediate_size", 128},
                                                          {"num_hidden_layers", 6},
                                                          {"num_attention_heads", 4},
                                                          {"num_key_value_heads", 2},
                                                          {"head_dim", 32},
                                                          {"query_pre_attn_scalar", 32},
                                                          {"rms_norm_eps", 1e-6},
                                                          {"sliding_window", 8},
                                                          {"hidden_activation", kGeluTanh},
                                                          {"bos_token_id", 1},
                                                          {"eos_token_id", 2}},
                                           "gemma3 test config");
  ASSERT_FALSE(is_sliding_layer(c, 5));
  ASSERT_TRUE(is_sliding_layer(c, 4));
  // llama.cpp stays 1.4e-4 (relative; max |dlogp| 8e-4, mean NLL within 2e-6) from the
  // table-GELU reference here, against 2.4e-5 for the 4-layer Gemma 2: the table's own noise
  // floor is as large here (1.5e-4 relative: six layers of fp16-rounded GELU inputs, a 1e-6
  // change of the matmul inputs flips some), so it is bounded by that floor; fusetune is
  // within 7e-7 of the exact reference.
  check_gemma_family(c, "gemma3", text);
}

// A Gemma 3 checkpoint saved as Gemma3ForConditionalGeneration (text model under
// language_model., a vision tensor beside it) exports as its text model: the GGUF file is byte
// for byte the one of the same text model saved as Gemma3ForCausalLM (llama.cpp's gemma3 is
// the text model; the vision tower would be a separate mmproj file).
TEST(GgufLlamaCpp, Gemma3MultimodalCheckpointExportsItsTextModel) {
  FT_REQUIRE_ASSET("stories260K/tokenizer.json");
  const fs::path tok = fusetune::testing::assets_dir() / "stories260K";
  const nlohmann::json text = {
      {"model_type", "gemma3_text"}, {"vocab_size", 512},      {"hidden_size", 64},
      {"intermediate_size", 128},    {"num_hidden_layers", 2}, {"num_attention_heads", 4},
      {"num_key_value_heads", 2},    {"head_dim", 32},         {"sliding_window", 8},
      {"bos_token_id", 1},           {"eos_token_id", 2}};
  const ModelConfig c = parse_model_config(text, "gemma3 text config");
  fusetune::testing::TempDir tmp;
  std::mt19937 rng(9);
  std::normal_distribution<float> n(0.0f, 0.1f);
  NamedTensors ts, stored;
  for (const auto& [name, shape] : expected_parameters(c)) {
    Tensor t = Tensor::empty(shape, DType::F32);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = n(rng);
    ts.push_back({name, t});
    stored.push_back({"language_model." + name, t});  // language_model.model.*
  }
  stored.push_back({"vision_tower.vision_model.post_layernorm.weight", ts.back().second});
  // The same directory name in both: general.name is the directory's.
  const fs::path text_dir = tmp / "text" / "model", mm_dir = tmp / "mm" / "model";
  save_hf_checkpoint(text_dir, c, ts);
  fs::create_directories(mm_dir);
  std::ofstream(mm_dir / "config.json")
      << nlohmann::json{{"model_type", "gemma3"},
                        {"architectures", {"Gemma3ForConditionalGeneration"}},
                        {"text_config", text},
                        {"vision_config", {{"model_type", "siglip_vision_model"}}}}
             .dump();
  save_safetensors(mm_dir / "model.safetensors", stored);
  for (const fs::path& d : {text_dir, mm_dir})
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) fs::copy_file(tok / f, d / f);
  gguf::export_gguf(text_dir, tmp / "text.gguf", gguf::FileType::F32);
  const auto r = gguf::export_gguf(mm_dir, tmp / "mm.gguf", gguf::FileType::F32);
  EXPECT_EQ(r.tensors.size(), expected_parameters(c).size());
  std::ifstream a(tmp / "text.gguf", std::ios::binary), b(tmp / "mm.gguf", std::ios::binary);
  const std::string bytes_a(std::istreambuf_iterator<char>(a), {}),
      bytes_b(std::istreambuf_iterator<char>(b), {});
  EXPECT_GT(bytes_a.size(), 100000u);
  EXPECT_TRUE(bytes_a == bytes_b);
}

// Phi-3 (model_type phi3: q, k and v as one qkv_proj, gate and up as one gate_up_proj, NEOX
// RoPE, untied head) with random weights and stories260K's tokenizer, exported as F32 GGUF
// (architecture phi3: attn_qkv and ffn_up written as stored): fusetune and llama.cpp agree with
// the double reference run on the same weights split into q/k/v and gate/up (a Llama).
namespace {

// A tiny Phi-3 (hidden 64, GQA 4:2, untied; `extra` keys on top), 48 tokens of a story.
ModelConfig tiny_phi3(const nlohmann::json& extra = nlohmann::json::object()) {
  nlohmann::json j = {{"model_type", "phi3"},     {"vocab_size", 512},
                      {"hidden_size", 64},        {"intermediate_size", 128},
                      {"num_hidden_layers", 2},   {"num_attention_heads", 4},
                      {"num_key_value_heads", 2}, {"rms_norm_eps", 1e-5},
                      {"bos_token_id", 1},        {"eos_token_id", 2}};
  j.update(extra);
  return parse_model_config(j, "phi3 test config");
}

// Phi-3's fused weights as a Llama's: qkv_proj's rows as q, k and v, gate_up_proj's as gate and
// up.
TensorMap phi3_split(const ModelConfig& c, const TensorMap& params) {
  const int64_t hd = c.head_dim, H = c.num_attention_heads, KV = c.num_key_value_heads,
                F = c.intermediate_size, D = c.hidden_size;
  auto rows = [&](const Tensor& w, int64_t start, int64_t n) {
    Tensor out = Tensor::empty({n, D}, DType::F32);
    std::copy(w.data<float>() + start * D, w.data<float>() + (start + n) * D, out.data<float>());
    return out;
  };
  TensorMap split;
  for (const auto& [name, t] : params) {
    const std::string layer = name.substr(0, name.find_last_of('.', name.rfind(".weight") - 1) + 1);
    if (name.find("qkv_proj") != std::string::npos) {
      split[layer + "q_proj.weight"] = rows(t, 0, H * hd);
      split[layer + "k_proj.weight"] = rows(t, H * hd, KV * hd);
      split[layer + "v_proj.weight"] = rows(t, (H + KV) * hd, KV * hd);
    } else if (name.find("gate_up_proj") != std::string::npos) {
      split[layer + "gate_proj.weight"] = rows(t, 0, F);
      split[layer + "up_proj.weight"] = rows(t, F, F);
    } else {
      split[name] = t;
    }
  }
  return split;
}

void check_phi3(const ModelConfig& c, const char* tag) {
  const StoryText text = story_text(48);
  std::mt19937 rng(7);
  NamedTensors ts;
  TensorMap params;
  for (const auto& [name, shape] : expected_parameters(c)) {
    Tensor t = Tensor::empty(shape, DType::F32);
    const bool norm = shape.size() == 1;
    std::normal_distribution<float> n(norm ? 1.0f : 0.0f, norm ? 0.2f : 0.1f);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = n(rng);
    ts.push_back({name, t});
    params[name] = t;
  }
  const TensorMap split = phi3_split(c, params);
  ASSERT_TRUE(split.count("model.layers.1.self_attn.v_proj.weight"));
  ASSERT_TRUE(split.count("model.layers.1.mlp.up_proj.weight"));
  ModelConfig llama = c;
  llama.model_type = "llama";
  const auto lp = fusetune_logprobs(c, params, text.ids);
  const auto ref = reference_logprobs(llama, split, text.ids, gguf::FileType::F32, false);
  const Diff d_ft = compare(lp, nlohmann::json(ref));
  const double nll_ft = mean_nll(lp, text.ids);
  EXPECT_LT(d_ft.max_rel, 1e-5);
  EXPECT_GT(nll_ft, 1.0);

  if (auto why = llama_cpp_unavailable(); !why.empty()) FT_SKIP_UNLESS_REQUIRED(why);
  fusetune::testing::TempDir tmp;
  // Not named phi3: llama.cpp keys tokenizer fixes for Phi-3's own vocabulary (<|endoftext|>,
  // </s>) on general.name, the directory's name, and stories260K's has neither.
  const fs::path ck = tmp / "tiny-random";
  save_hf_checkpoint(ck, c, ts);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(text.src / f, ck / f);
  const fs::path file = tmp / (std::string(tag) + "-f32.gguf");
  const auto r = gguf::export_gguf(ck, file, gguf::FileType::F32);
  int fused = 0;
  for (const auto& [name, type] : r.tensors)
    fused += name.find("attn_qkv") != std::string::npos || name.find("ffn_up") != std::string::npos;
  EXPECT_EQ(fused, 4);
  int rope_factors = 0;  // LongRoPE's long and short factors
  for (const auto& [name, type] : r.tensors) rope_factors += name.rfind("rope_factors_", 0) == 0;
  EXPECT_EQ(rope_factors, c.rope_scaling.rope_type == "longrope" ? 2 : 0);
  const auto cpp = run_llama_cpp(file, text.ids, text.story, tmp.path());
  ASSERT_EQ(cpp["logprobs"].size(), text.ids.size());
  std::vector<std::vector<double>> cpp_lp;
  for (const auto& row : cpp["logprobs"]) cpp_lp.push_back(row.get<std::vector<double>>());
  const Diff d = compare(lp, cpp["logprobs"]), d_ref = compare(ref, cpp["logprobs"]);
  const double nll_cpp = mean_nll(cpp_lp, text.ids);
  std::printf(
      "[gguf %s f32] %zu tokens, |dlogp| llama.cpp vs fusetune max %.3g (rel %.3g) mean %.3g, "
      "llama.cpp vs reference max %.3g, fusetune vs reference max %.3g; mean NLL llama.cpp %.6f, "
      "fusetune %.6f\n",
      tag, text.ids.size(), d.max_abs, d.max_rel, d.mean_abs, d_ref.max_abs, d_ft.max_abs, nll_cpp,
      nll_ft);
  EXPECT_LT(d.max_rel, 1e-4);
  EXPECT_LT(d_ref.max_rel, 1e-4);
  EXPECT_NEAR(nll_cpp, nll_ft, 1e-5);
  if (c.rope_scaling.rope_type.empty())
    check_quantized_exports(
        c, params, ck, text, tmp.path(), llama,
        [&c](const TensorMap& m) { return phi3_split(c, m); }, /*ggml_gelu=*/false);
}

}  // namespace

TEST(GgufLlamaCpp, Phi3F32LogitsAgreeWithFusetuneAndTheReference) {
  FT_REQUIRE_ASSET("stories260K/tokenizer.json");
  FT_REQUIRE_ASSET("datasets/tinystories_sample.txt");
  check_phi3(tiny_phi3(), "phi3");
}

// Phi-3's LongRoPE (the 128k models' rope_scaling: type longrope, short and long factors per
// frequency; original_max_position_embeddings 32 under the 48 tokens, so the long factors act,
// and max_position_embeddings 128, so attention_factor is sqrt(1 + ln 4 / ln 32)): the GGUF's
// rope_factors_long/short and rope.scaling.* make llama.cpp rotate as fusetune and the double
// reference do. llama.cpp picks the long factors by its context size (64 here) against
// original_context_length, transformers by the sequence length: both exceed 32 here.
TEST(GgufLlamaCpp, Phi3LongRopeF32LogitsAgreeWithFusetuneAndTheReference) {
  FT_REQUIRE_ASSET("stories260K/tokenizer.json");
  FT_REQUIRE_ASSET("datasets/tinystories_sample.txt");
  std::vector<double> short_factor, long_factor;
  for (int i = 0; i < 8; ++i) {  // head_dim 16: 8 frequencies
    short_factor.push_back(1.0 + 0.05 * i);
    long_factor.push_back(1.0 + 1.5 * i);
  }
  const ModelConfig c = tiny_phi3(
      {{"max_position_embeddings", 128},
       {"original_max_position_embeddings", 32},
       {"rope_theta", 10000.0},
       {"rope_scaling",
        {{"type", "longrope"}, {"short_factor", short_factor}, {"long_factor", long_factor}}}});
  ASSERT_EQ(c.rope_scaling.rope_type, "longrope");
  ASSERT_NEAR(c.rope_scaling.attention_factor, std::sqrt(1 + std::log(4.0) / std::log(32.0)),
              1e-12);
  check_phi3(c, "phi3-longrope");
}
