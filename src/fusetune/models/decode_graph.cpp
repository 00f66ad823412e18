#include "fusetune/models/decode_graph.h"

#include "fusetune/graph/builder.h"
#include "fusetune/graph/verifier.h"
#include "fusetune/util/error.h"

namespace fusetune {

Graph build_decode_graph(const ModelConfig& cfg, int64_t batch, int64_t tokens, int64_t cache_len,
                         DType dtype, const LlamaOptions& llama) {
  FT_CHECK(batch >= 1 && tokens >= 1 && cache_len >= tokens,
           "build_decode_graph: need batch >= 1 and 1 <= tokens <= cache_len");
  Graph g(dtype);
  Builder b(g);
  LlamaInputs in;
  in.tokens = g.input("tokens", {batch, tokens}, DType::I32);
  in.positions = g.input("positions", {batch, tokens}, DType::I32);
  in.cache_len = cache_len;
  in.cache_pos = g.input("cache_pos", {}, DType::I32);
  in.cache_start = g.input("cache_start", {batch}, DType::I32);
  LlamaOptions options = llama;
  options.last_position_only = true;
  LlamaOutputs m = build_llama(
      b, cfg, in, [](const std::string&) { return false; }, options);
  g.mark_output("logits", m.logits.valid() ? m.logits : b.matmul(m.hidden, m.lm_head, false, true));
  verify_graph(g);
  return g;
}

}  // namespace fusetune
