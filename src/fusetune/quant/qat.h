#pragma once
// Quantization-aware training (torchtune's QAT recipes): the model's linear layers computed
// with fake-quantized weights and activations (kernels/cpu/fake_quant.h), the gradient passing
// through by the straight-through estimator, so that training sees the arithmetic the
// quantized model will run with. The `quantizer` config section selects the scheme:
//
//   _component_                         weights (q/k/v/o, gate/up/down)   activations
//   Int8DynActInt4WeightQATQuantizer    int4 symmetric, per `groupsize`   int8 per token, asym.
//   Int4WeightOnlyQATQuantizer          uint4 asymmetric, per `groupsize` (float)
//   gguf_q4_0                           ggml Q4_0 (blocks of 32)          ggml Q8_0 (blocks of 32)
//                                       (head: Q6_K, see below)           (head: Q8_K)
//   gguf_q8_0                           ggml Q8_0                          ggml Q8_0
//
// (torchtune's spellings torchtune.training.quantization.X and torchao's
// torchao.quantization.qat.X are aliases of the first two.) Embedding and output head:
//   - torchao schemes: as torchao's quantizers, which replace every nn.Linear: an untied head
//     is quantized like the layers, a tied head (not an nn.Linear in torchtune) and the
//     embedding are not;
//   - gguf schemes: as llama.cpp's llama-quantize defaults for the type: gguf_q8_0 stores
//     token_embd and output as Q8_0; gguf_q4_0 stores token_embd as Q4_0 and output as Q6_K,
//     or Q8_0 when its rows are not a multiple of 256 (a tied model's one table gets the
//     output's type); the head is fake-quantized so, its input to Q8_K for a Q6_K head and to
//     Q8_0 for a Q8_0 one (llama.cpp's vec_dot_type for each); the gathered embedding rows
//     are fake-quantized (blocks lie along a row: the rows of the fake-quantized table, with
//     no copy of the table).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fusetune/config/config.h"
#include "fusetune/kernels/cpu/fake_quant.h"
#include "fusetune/models/llama.h"

namespace fusetune::quant {

enum class QatScheme { Int8DynActInt4Weight, Int4WeightOnly, GgufQ4_0, GgufQ8_0 };

struct QatConfig {
  QatScheme scheme = QatScheme::Int8DynActInt4Weight;
  int64_t groupsize = 256;    // the torchao schemes
  int64_t inner_k_tiles = 8;  // Int4WeightOnly: rows must be multiples of 16 x this (torchao)
  // torchtune's fake_quant_after_n_steps: optimizer steps trained without fake quantization
  // (none: fake quantization from the first step).
  std::optional<int64_t> fake_quant_after_n_steps;
};

// The `quantizer` section and fake_quant_after_n_steps of a QAT recipe's config.
QatConfig qat_config_from(const Config& cfg);
const char* scheme_name(QatScheme s);

// What one site computes with: scheme None = left in float (also where the site's rows are not
// whole groups of the scheme: see check_model).
struct SiteQuant {
  kernels::FakeQuantSpec weight, activation;
};
// For a linear site (decoder projections and "lm_head") and the embedding
// ("model.embed_tokens"). Throws naming the site when the scheme cannot quantize it (a row
// length that is not a whole number of groups).
SiteQuant site_quant(const QatConfig& c, const ModelConfig& model, const LinearSite& site);

// Every site of `model` through site_quant, before training: throws where the scheme refuses
// a layer; returns the layers the scheme quantizes that stay float because their rows are not
// whole groups (torchao's 8da4w quantizer skips them, llama.cpp cannot store them in Q4_0/Q8_0).
std::vector<std::string> check_model(const QatConfig& c, const ModelConfig& model);

// The graph input that switches fake quantization on (1) or off (0) for a step.
inline constexpr const char* kFakeQuantEnabledInput = "fake_quant_enabled";

// The model hooks: every site site_quant quantizes gets FakeQuantMatMul (weights fake-quantized
// tile by tile inside the GEMM) after a FakeQuantize of its input; the embedding's gathered
// rows go through a FakeQuantize. `switchable`: the ops read the [] I32 graph input
// kFakeQuantEnabledInput (fed each step); otherwise fake quantization is always on
// (evaluation). `model` is read when a graph is built (a recipe fills it after loading).
LlamaOptions qat_llama_options(const QatConfig& c, std::shared_ptr<const ModelConfig> model,
                               bool switchable);

// The enable input's value at an optimizer step (torchtune: on once global_step reaches
// fake_quant_after_n_steps).
bool fake_quant_enabled_at(const QatConfig& c, int64_t global_step);

}  // namespace fusetune::quant
