#pragma once
// Generation with a KV cache (docs/design.md §9). A batch of prompts is left-padded to a
// common length P; one prefill run of the step graph (models/decode_graph.h) with T = P fills the
// cache and gives the first token's logits, then each decode run feeds one token per row at
// the next cache slot. Both graphs go through compile_graph like a training step (compile:
// false runs them eagerly) and share one arena. A row stops at one of its stop tokens; the
// batch stops when every row has, at max_new_tokens, or when the cache (the model's
// max_position_embeddings) is full.
//
// use_kv_cache = false recomputes the whole sequence for every token (the reference the cache
// is checked against, and torchtune's enable_kv_cache: false).
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fusetune/compile/pass.h"
#include "fusetune/generation/sampling.h"
#include "fusetune/models/llama.h"
#include "fusetune/runtime/executor.h"
#include "fusetune/runtime/shared_arena.h"

namespace fusetune {

// The vocabulary from which a decode step's per-row work over the logits (sampling, a chosen
// token's log-prob) runs the rows in parallel: below it a row costs less than waking a thread
// team.
inline constexpr int64_t kParallelRowsMinVocab = 16384;

struct GenerationOptions {
  int64_t max_new_tokens = 300;
  SamplingOptions sampling;
  uint64_t seed = 1234;
  // When set (one per row): each row draws from its own generator seeded so, and its tokens
  // then do not depend on which other rows share the batch (GRPO's rollouts over any number
  // of ranks). Otherwise one generator seeded by `seed` draws every row in turn.
  std::vector<uint64_t> row_seeds;
  std::vector<int32_t> stop_tokens;  // e.g. EOS and the chat template's end of turn
  bool use_kv_cache = true;
};

struct GenerationStats {
  int64_t prompt_tokens = 0;     // real (unpadded) prompt tokens over the batch
  int64_t generated_tokens = 0;  // over the batch, stop tokens included
  int64_t decode_steps = 0;      // decode runs (the first token comes from the prefill)
  double prefill_seconds = 0, decode_seconds = 0, compile_seconds = 0;
  int64_t kv_cache_bytes = 0;
};

struct GenerationResult {
  std::vector<std::vector<int32_t>> tokens;  // per row: the new tokens, a final stop token kept
  std::vector<std::string> finish_reason;    // per row: "stop", "length" or "context"
  GenerationStats stats;
};

class Generator {
 public:
  // params: the model's weights by name (adapters included when `llama` applies them).
  // `arena`: the buffer the compiled steps share; a caller whose own graphs never run during a
  // generation (GRPO's update) passes theirs, so one buffer serves both.
  Generator(const ModelConfig& cfg, const TensorMap& params, LlamaOptions llama, CompileMode mode,
            DType dtype, std::shared_ptr<SharedArena> arena = std::make_shared<SharedArena>());

  // on_token(row, token) is called as each token is chosen (streaming).
  GenerationResult generate(const std::vector<std::vector<int32_t>>& prompts,
                            const GenerationOptions& o,
                            const std::function<void(int64_t, int32_t)>& on_token = {});

  // Called with every run's logits [B, V] (tests compare the cache against a recomputation).
  std::function<void(const Tensor& logits)> on_logits;
  // Called once each run's tokens are chosen, with its logits [B, V] and per row the token
  // chosen from them (-1 for a row that had finished): GRPO's rollout reads each chosen
  // token's log-prob here, as the logits arrive, and keeps no copy of them.
  std::function<void(const Tensor& logits, const std::vector<int32_t>& chosen)> on_chosen;

 private:
  Executor& step(int64_t batch, int64_t tokens, int64_t cache_len, double* compile_seconds);

  ModelConfig cfg_;
  TensorMap params_;  // shares the caller's storage
  LlamaOptions llama_;
  CompileMode mode_;
  DType dtype_;
  std::shared_ptr<SharedArena> arena_;
  std::map<std::vector<int64_t>, std::unique_ptr<Executor>> steps_;  // by (B, T, S)
};

}  // namespace fusetune
