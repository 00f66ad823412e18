#include "fusetune/peft/nf4_weight.h"

#include <array>
#include <cstring>
#include <exception>
#include <vector>

#include "fusetune/models/model_family.h"
#include "fusetune/util/error.h"

namespace fusetune::peft {
namespace {
constexpr std::array<const char*, 3> kNF4PartSuffixes = {".nf4_codes", ".nf4_absmax_codes",
                                                         ".nf4_absmax_scales"};
}  // namespace

kernels::NF4View NF4Weight::view() const {
  return {codes.data<int32_t>(),
          absmax_codes.data<int32_t>(),
          reinterpret_cast<const float*>(absmax_scales.data<int32_t>()),
          offset,
          shape[0],
          shape[1]};
}

namespace {

NF4Weight empty_nf4(const Shape& shape) {
  FT_CHECK(shape.size() == 2, "NF4: expected a matrix, got " + shape_str(shape));
  const kernels::NF4Sizes s = kernels::nf4_sizes(shape_numel(shape));
  NF4Weight q;
  q.shape = shape;
  q.codes = Tensor::empty({s.code_words}, DType::I32);
  q.absmax_codes = Tensor::empty({s.absmax_words}, DType::I32);
  q.absmax_scales = Tensor::empty({s.scales}, DType::I32);
  return q;
}

}  // namespace

NF4Weight quantize_nf4(const Shape& shape, const ParamSink::ElementSource& values) {
  NF4Weight q = empty_nf4(shape);
  const int64_t n = shape_numel(shape), blocks = kernels::nf4_sizes(n).blocks;
  // Each thread produces and quantizes its own chunks of 2^16 elements (256 KiB of F32, a
  // multiple of the block, so no block is split): the F32 values are still in the core's cache
  // when quantized, and producing them (the random init, a checkpoint's widening) runs in
  // parallel too. Chunk c alone writes its codes and absmax, so the bits do not depend on the
  // thread count.
  constexpr int64_t kChunk = int64_t(1) << 16;
  static_assert(kChunk % kernels::kNF4Block == 0);
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<float> absmax(static_cast<size_t>(blocks));
  std::exception_ptr error;  // the first one thrown; rethrown after the parallel region
#pragma omp parallel if (chunks > 1)
  {
    std::vector<float> chunk(size_t(std::min(n, kChunk)));
#pragma omp for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t first = c * kChunk, m = std::min(kChunk, n - first);
      try {
        values(first, m, chunk.data());
        kernels::nf4_quantize_blocks(chunk.data(), m, q.codes.data<int32_t>() + first / 8,
                                     absmax.data() + first / kernels::kNF4Block);
      } catch (...) {
#pragma omp critical(fusetune_nf4_error)
        if (!error) error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
  kernels::nf4_quantize_absmax(absmax.data(), blocks, q.absmax_codes.data<int32_t>(),
                               reinterpret_cast<float*>(q.absmax_scales.data<int32_t>()),
                               &q.offset);
  return q;
}

NF4Weight quantize_nf4(const Tensor& w) {
  FT_CHECK(w.rank() == 2, "NF4: expected a matrix, got " + shape_str(w.shape()));
  FT_CHECK(is_floating(w.dtype()),
           std::string("NF4: cannot quantize dtype ") + dtype_name(w.dtype()));
  // A bf16 / fp16 base (dtype: bf16 loads the checkpoint so) is quantized from its exact fp32
  // widening, as bitsandbytes quantizes a bf16 weight; widened a chunk at a time.
  if (w.dtype() == DType::BF16 || w.dtype() == DType::F16) {
    const auto* bytes = static_cast<const uint8_t*>(w.raw());
    const size_t es = dtype_size(w.dtype());
    return quantize_nf4(w.shape(), [&](int64_t first, int64_t n, float* out) {
      widen_to_f32(bytes + size_t(first) * es, w.dtype(), n, out);
    });
  }
  NF4Weight q = empty_nf4(w.shape());
  float* scales = reinterpret_cast<float*>(q.absmax_scales.data<int32_t>());
  if (w.dtype() == DType::F32)
    kernels::nf4_quantize(w.data<float>(), w.numel(), q.codes.data<int32_t>(),
                          q.absmax_codes.data<int32_t>(), scales, &q.offset);
  else
    kernels::nf4_quantize(w.data<double>(), w.numel(), q.codes.data<int32_t>(),
                          q.absmax_codes.data<int32_t>(), scales, &q.offset);
  return q;
}

Tensor dequantize_nf4(const NF4Weight& w, DType dtype) {
  Tensor out = Tensor::empty(w.shape, dtype);
  if (dtype == DType::F64)
    kernels::nf4_dequantize_rows(w.view(), 0, w.shape[0], out.data<double>());
  else if (dtype == DType::F32)
    kernels::nf4_dequantize_rows(w.view(), 0, w.shape[0], out.data<float>());
  else
    throw Error(std::string("NF4: cannot dequantize to ") + dtype_name(dtype));
  return out;
}

namespace {

// What quantize_base stores as NF4, with shapes: the layers' projections, the embedding and
// the untied head.
std::vector<std::pair<std::string, Shape>> quantized_weights(const ModelConfig& cfg) {
  const int64_t D = cfg.hidden_size, V = cfg.vocab_size;
  std::vector<std::pair<std::string, Shape>> out;
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const LayerProjection& proj : layer_projections(cfg))
      out.push_back({p + proj.module + ".weight", {proj.out, proj.in}});
  }
  out.push_back({"model.embed_tokens.weight", {V, D}});
  if (!cfg.tie_word_embeddings) out.push_back({"lm_head.weight", {V, D}});
  return out;
}

}  // namespace

std::shared_ptr<NF4Store> quantize_base_weights(TensorMap& params, const ModelConfig& cfg) {
  auto store = std::make_shared<NF4Store>();
  for (const auto& [name, shape] : quantized_weights(cfg)) {
    auto it = params.find(name);
    FT_CHECK(it != params.end(), "quantize_base: parameter '" + name + "' is missing");
    (*store)[name] = quantize_nf4(it->second);
    params.erase(it);  // the fp32 copy is gone: NF4 is the base now
  }
  return store;
}

bool NF4BaseSink::takes(const std::string& name) const {
  // The names quantized_weights lists, for any config: the layers' projection weights, the
  // embedding and the untied head (a tied model has no lm_head parameter).
  if (name == "model.embed_tokens.weight" || name == "lm_head.weight") return true;
  if (name.rfind("model.layers.", 0) != 0) return false;
  for (const char* suffix :
       {".self_attn.q_proj.weight", ".self_attn.k_proj.weight", ".self_attn.v_proj.weight",
        ".self_attn.o_proj.weight", ".mlp.gate_proj.weight", ".mlp.up_proj.weight",
        ".mlp.down_proj.weight", ".self_attn.qkv_proj.weight", ".mlp.gate_up_proj.weight"}) {
    const size_t n = std::strlen(suffix);
    if (name.size() > n && name.compare(name.size() - n, n, suffix) == 0) return true;
  }
  return false;
}

void NF4BaseSink::put(const std::string& name, const Shape& shape, const ElementSource& values) {
  FT_CHECK(!store_->count(name), "quantize_base: parameter '" + name + "' given twice");
  (*store_)[name] = quantize_nf4(shape, values);
}

std::shared_ptr<NF4Store> NF4BaseSink::finish(const ModelConfig& cfg) {
  const auto want = quantized_weights(cfg);
  for (const auto& [name, shape] : want) {
    auto it = store_->find(name);
    FT_CHECK(it != store_->end(), "quantize_base: parameter '" + name + "' is missing");
    FT_CHECK(it->second.shape == shape, "quantize_base: parameter '" + name + "' is " +
                                            shape_str(it->second.shape) + ", expected " +
                                            shape_str(shape));
  }
  FT_CHECK(store_->size() == want.size(),
           "quantize_base: the model has weights quantize_base does not expect");
  return store_;
}

std::shared_ptr<NF4Store> nf4_store_layout(const ModelConfig& cfg) {
  auto store = std::make_shared<NF4Store>();
  for (const auto& [name, shape] : quantized_weights(cfg)) {
    const kernels::NF4Sizes s = kernels::nf4_sizes(shape_numel(shape));
    NF4Weight& w = (*store)[name];
    w.shape = shape;
    w.codes = Tensor::empty({s.code_words}, DType::I32);
    w.absmax_codes = Tensor::empty({s.absmax_words}, DType::I32);
    w.absmax_scales = Tensor::empty({s.scales}, DType::I32);
  }
  return store;
}

std::array<Value, 3> nf4_parts(Graph& g, const NF4Weight& w, const std::string& name) {
  const std::array<const Tensor*, 3> parts = {&w.codes, &w.absmax_codes, &w.absmax_scales};
  const kernels::NF4Sizes s = kernels::nf4_sizes(shape_numel(w.shape));
  const std::array<int64_t, 3> numels = {s.code_words, s.absmax_words, s.scales};
  std::array<Value, 3> out;
  for (size_t i = 0; i < 3; ++i) {
    if (!w.bound_at_run) {
      out[i] = g.constant(*parts[i], name + kNF4PartSuffixes[i]);
      continue;
    }
    out[i] = g.param(name + kNF4PartSuffixes[i], {numels[i]}, /*trainable=*/false);
    g.mutable_nodes()[size_t(out[i].node)].outputs[0].dtype = DType::I32;  // packed, not float
  }
  return out;
}

std::map<std::string, Tensor*> bind_nf4_at_run(NF4Store& store) {
  std::map<std::string, Tensor*> parts;
  for (auto& [name, w] : store) {
    w.bound_at_run = true;
    parts[name + kNF4PartSuffixes[0]] = &w.codes;
    parts[name + kNF4PartSuffixes[1]] = &w.absmax_codes;
    parts[name + kNF4PartSuffixes[2]] = &w.absmax_scales;
  }
  return parts;
}

Value nf4_linear(Builder& b, Value x, const NF4Weight& w, const std::string& name) {
  Graph& g = b.graph();
  Shape xs = b.shape(x);
  const int64_t k = xs.back();
  FT_CHECK(k == w.shape[1], "NF4 weight '" + name + "' is " + shape_str(w.shape) +
                                " but its input is " + shape_str(xs));
  Value x2 = b.reshape(x, {shape_numel(xs) / k, k});
  const std::array<Value, 3> p = nf4_parts(g, w, name);
  Attrs at;
  at.shape = w.shape;
  at.scalar = double(w.offset);
  Value y = g.add1(Op::NF4MatMul, {x2, p[0], p[1], p[2]}, at, name);
  Shape out = xs;
  out.back() = w.shape[0];
  return b.reshape(y, out);
}

}  // namespace fusetune::peft

namespace fusetune::peft {

Value nf4_embedding(Builder& b, Value ids, const NF4Weight& table, const std::string& name) {
  Graph& g = b.graph();
  Attrs at;
  at.shape = table.shape;
  at.scalar = double(table.offset);
  const std::array<Value, 3> p = nf4_parts(g, table, name);
  return g.add1(Op::NF4Embedding, {ids, p[0], p[1], p[2]}, at, name);
}

}  // namespace fusetune::peft
