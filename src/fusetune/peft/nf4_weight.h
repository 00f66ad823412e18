#pragma once
// QLoRA's frozen base weights: a linear weight quantized to NF4 (kernels/cpu/nf4.h has the
// format). The three parts are I32 tensors so they can be graph Constants: the graph shares
// their storage, so every step graph built for a new batch shape reads the same bytes. The
// fp32 weight is dropped once quantized; dequantizing (merge, save) makes a temporary copy.
#include <array>
#include <map>
#include <memory>
#include <string>

#include "fusetune/graph/builder.h"
#include "fusetune/kernels/cpu/nf4.h"
#include "fusetune/models/model_config.h"
#include "fusetune/models/param_sink.h"
#include "fusetune/runtime/executor.h"

namespace fusetune::peft {

struct NF4Weight {
  Shape shape;           // [out, in]
  Tensor codes;          // I32 [ceil(numel / 8)]
  Tensor absmax_codes;   // I32 [ceil(blocks / 4)]
  Tensor absmax_scales;  // I32 [ceil(blocks / 256)], fp32 bit patterns
  float offset = 0;
  // ZeRO-3: the graphs bind the three parts as frozen Params named <weight>.nf4_codes,
  // .nf4_absmax_codes, .nf4_absmax_scales (gathered from the rank that owns each, in this
  // packed form, when used) instead of holding them as Constants; a rank may then hold none.
  bool bound_at_run = false;

  kernels::NF4View view() const;
  int64_t nbytes() const {
    return int64_t(codes.nbytes() + absmax_codes.nbytes() + absmax_scales.nbytes());
  }
};

// `w` is a float matrix (F32, F64, or BF16 / F16: widened a chunk at a time).
NF4Weight quantize_nf4(const Tensor& w);
// The same bits, from a matrix produced a range of elements at a time (models/param_sink.h):
// only a 256 KiB chunk per thread exists in F32 at once.
NF4Weight quantize_nf4(const Shape& shape, const ParamSink::ElementSource& values);
Tensor dequantize_nf4(const NF4Weight& w, DType dtype);

// Quantized weights by parameter name ("model.layers.0.self_attn.q_proj.weight").
using NF4Store = std::map<std::string, NF4Weight>;

// Quantizes the big frozen matrices of `params` and removes their float copies: every
// decoder-layer projection (q/k/v/o, gate/up/down), the embedding table and the untied
// lm_head (a tied head is the embedding: one stored matrix serves both). Norms and biases
// stay float. torchtune / bitsandbytes keep the embedding and head in bf16; we quantize them
// too, on purpose: on small models they are most of the weight bytes (configs/README.md).
std::shared_ptr<NF4Store> quantize_base_weights(TensorMap& params, const ModelConfig& cfg);

// QLoRA's base quantized while it is loaded or initialized (models/param_sink.h): it takes
// exactly the weights quantize_base_weights quantizes and stores each as NF4 as it arrives,
// so the base never exists in float. The result equals quantize_base_weights' bit for bit.
class NF4BaseSink : public ParamSink {
 public:
  bool takes(const std::string& name) const override;
  void put(const std::string& name, const Shape& shape, const ElementSource& values) override;
  // The store, after checking it holds every weight quantize_base covers for `cfg`.
  std::shared_ptr<NF4Store> finish(const ModelConfig& cfg);

 private:
  std::shared_ptr<NF4Store> store_ = std::make_shared<NF4Store>();
};

// The store quantize_base_weights makes for `cfg`, with every tensor sized but its contents
// unset: for `fusetune plan`, which predicts a step's memory without reading weights.
std::shared_ptr<NF4Store> nf4_store_layout(const ModelConfig& cfg);

// ZeRO-3: marks every weight of `store` bound_at_run and returns its parts by their Param
// names, for dist::ShardedParams to shard with the frozen parameters.
std::map<std::string, Tensor*> bind_nf4_at_run(NF4Store& store);

// x [..., in] -> x W^T [..., out] with W dequantized tile by tile inside the GEMM.
Value nf4_linear(Builder& b, Value x, const NF4Weight& w, const std::string& name);

// The three part leaves of `w` (codes, absmax codes, absmax scales), named after its weight:
// Constants sharing the stored bytes, or (bound_at_run) frozen I32 Params sized from the
// logical shape, the tensors possibly elsewhere. NF4MatMul and the fused heads read them.
std::array<Value, 3> nf4_parts(Graph& g, const NF4Weight& w, const std::string& name);

// ids [...] I32 -> table rows [..., D], only the gathered rows dequantized. No gradient.
Value nf4_embedding(Builder& b, Value ids, const NF4Weight& table, const std::string& name);

}  // namespace fusetune::peft
