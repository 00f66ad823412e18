#pragma once
// The tiny model the QAT tests train (dims that are whole groups of 8-32; hidden 256 makes
// gguf_q4_0's head Q6_K) and the graph input that switches fake quantization on or off
// (quant/qat.h, fake_quant_after_n_steps).
#include "fusetune/quant/qat.h"
#include "tiny_models.h"

namespace fusetune::testing {

inline ModelConfig qat_model_config(bool tied, int64_t hidden = 32) {
  ModelConfig c = tiny_config(tied, false, 2);
  c.vocab_size = 37;
  c.hidden_size = hidden;
  c.intermediate_size = 64;
  c.head_dim = 8;
  return c;
}

// `in` plus the [] I32 input that turns fake quantization on (1) or off (0).
inline TensorMap with_enable(TensorMap in, int on) {
  Tensor t = Tensor::empty({}, DType::I32);
  t.data<int32_t>()[0] = on;
  in[quant::kFakeQuantEnabledInput] = t;
  return in;
}

}  // namespace fusetune::testing
