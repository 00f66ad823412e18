#include "fusetune/generation/generator.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "fusetune/compile/compiler.h"
#include "fusetune/generation/kv_cache.h"
#include "fusetune/models/decode_graph.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Row b of logits [B, V] as doubles (the sampler's input).
std::vector<double> logits_row(const Tensor& logits, int64_t b) {
  const int64_t V = logits.dim(1);
  std::vector<double> row(static_cast<size_t>(V));
  if (logits.dtype() == DType::F32) {
    const float* p = logits.data<float>() + b * V;
    std::copy(p, p + V, row.begin());
  } else {
    for (int64_t i = 0; i < V; ++i) row[size_t(i)] = element_as_double(logits, b * V + i);
  }
  return row;
}

// The next token of every unfinished row of logits [B, V] (-1 for a finished row). A row
// with its own sampler (row seeds) draws independently of the others, so those rows (and
// greedy ones, which draw nothing) are chosen in parallel: the same tokens for any thread
// count. One shared sampler draws the rows in turn.
std::vector<int32_t> generator_choose_tokens(const Tensor& logits,
                                             const std::vector<std::string>& finish_reason,
                                             std::vector<Sampler>& samplers, bool greedy) {
  const int64_t B = logits.dim(0);
  std::vector<int32_t> chosen(static_cast<size_t>(B), -1);
  const auto choose = [&](int64_t b) {
    if (!finish_reason[size_t(b)].empty()) return;
    const std::vector<double> row = logits_row(logits, b);
    Sampler& sampler = samplers[samplers.size() == 1 ? 0 : size_t(b)];
    chosen[size_t(b)] = sampler.next(row.data(), int64_t(row.size()));
  };
  if (samplers.size() == 1 && !greedy) {
    for (int64_t b = 0; b < B; ++b) choose(b);
    return chosen;
  }
#pragma omp parallel for schedule(dynamic, 1) if (B > 1 && logits.dim(1) >= kParallelRowsMinVocab)
  for (int64_t b = 0; b < B; ++b) choose(b);
  return chosen;
}

}  // namespace

Generator::Generator(const ModelConfig& cfg, const TensorMap& params, LlamaOptions llama,
                     CompileMode mode, DType dtype, std::shared_ptr<SharedArena> arena)
    : cfg_(cfg),
      params_(params),
      llama_(std::move(llama)),
      mode_(mode),
      dtype_(dtype),
      arena_(std::move(arena)) {}

Executor& Generator::step(int64_t batch, int64_t tokens, int64_t cache_len,
                          double* compile_seconds) {
  auto& slot = steps_[{batch, tokens, cache_len}];
  if (!slot) {
    const auto t0 = std::chrono::steady_clock::now();
    PassOptions po;
    po.mode = mode_;
    slot = compile_graph(build_decode_graph(cfg_, batch, tokens, cache_len, dtype_, llama_), po,
                         arena_)
               .executor;
    *compile_seconds += seconds_since(t0);
  }
  return *slot;
}

GenerationResult Generator::generate(const std::vector<std::vector<int32_t>>& prompts,
                                     const GenerationOptions& o,
                                     const std::function<void(int64_t, int32_t)>& on_token) {
  o.sampling.validate();
  FT_CHECK(!prompts.empty(), "generate: no prompt");
  FT_CHECK(o.max_new_tokens >= 1,
           "max_new_tokens must be >= 1, got " + std::to_string(o.max_new_tokens));
  const int64_t B = int64_t(prompts.size());
  int64_t P = 0;
  for (const auto& p : prompts) {
    FT_CHECK(!p.empty(), "generate: a prompt has no tokens");
    for (int32_t id : p)
      FT_CHECK(id >= 0 && id < cfg_.vocab_size,
               "generate: prompt token " + std::to_string(id) + " is outside the vocabulary");
    P = std::max<int64_t>(P, int64_t(p.size()));
  }
  const int64_t context = cfg_.max_position_embeddings;
  FT_CHECK(P < context, "the prompt has " + std::to_string(P) +
                            " tokens; the model's context (max_position_embeddings) is " +
                            std::to_string(context) + ", leaving no room for an answer");
  const int64_t S = std::min(P + o.max_new_tokens, context);

  // The sequences, left-padded: row b's real tokens start at slot start[b].
  std::vector<int32_t> start(static_cast<size_t>(B));
  std::vector<std::vector<int32_t>> seq(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const auto& p = prompts[size_t(b)];
    start[size_t(b)] = int32_t(P - int64_t(p.size()));
    seq[size_t(b)].assign(size_t(start[size_t(b)]), 0);
    seq[size_t(b)].insert(seq[size_t(b)].end(), p.begin(), p.end());
  }

  GenerationResult r;
  r.tokens.resize(size_t(B));
  r.finish_reason.assign(size_t(B), "");
  for (const auto& p : prompts) r.stats.prompt_tokens += int64_t(p.size());
  std::optional<KVCache> cache;
  if (o.use_kv_cache) {
    cache.emplace(cfg_, B, S, compute_dtype(dtype_));
    r.stats.kv_cache_bytes = cache->bytes();
  }
  FT_CHECK(o.row_seeds.empty() || int64_t(o.row_seeds.size()) == B,
           "generate: " + std::to_string(o.row_seeds.size()) + " row seeds for " +
               std::to_string(B) + " prompts");
  std::vector<Sampler> samplers;
  if (o.row_seeds.empty()) samplers.emplace_back(o.sampling, o.seed);
  for (uint64_t seed : o.row_seeds) samplers.emplace_back(o.sampling, seed);

  // Runs the step on slots [from, len) of every row; returns the last slot's logits [B, V].
  auto run = [&](int64_t from, int64_t len) {
    const int64_t T = len - from;
    Tensor tokens = Tensor::empty({B, T}, DType::I32),
           positions = Tensor::empty({B, T}, DType::I32);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t s = from + t;
        tokens.data<int32_t>()[b * T + t] = seq[size_t(b)][size_t(s)];
        positions.data<int32_t>()[b * T + t] = int32_t(std::max<int64_t>(0, s - start[size_t(b)]));
      }
    Tensor pos = Tensor::empty({}, DType::I32), starts = Tensor::empty({B}, DType::I32);
    pos.data<int32_t>()[0] = int32_t(from);
    std::copy(start.begin(), start.end(), starts.data<int32_t>());
    TensorMap in{
        {"tokens", tokens}, {"positions", positions}, {"cache_pos", pos}, {"cache_start", starts}};
    std::optional<KVCache> fresh;  // without a cache: a new one over the whole sequence
    if (cache) {
      cache->bind(in);
    } else {
      fresh.emplace(cfg_, B, len, compute_dtype(dtype_));
      fresh->bind(in);
    }
    Executor& ex = step(B, T, cache ? S : len, &r.stats.compile_seconds);
    Tensor logits = ex.run(in, params_)[0];
    if (on_logits) on_logits(logits);
    return logits;
  };

  int64_t len = P, done = 0;
  bool first = true;
  for (;;) {
    const int64_t from = (first || !cache) ? 0 : len - 1;
    const auto t0 = std::chrono::steady_clock::now();
    Tensor logits = run(from, len);
    (first ? r.stats.prefill_seconds : r.stats.decode_seconds) += seconds_since(t0);
    if (!first) ++r.stats.decode_steps;
    first = false;
    const std::vector<int32_t> chosen =
        generator_choose_tokens(logits, r.finish_reason, samplers, o.sampling.temperature == 0);
    if (on_chosen) on_chosen(logits, chosen);
    for (int64_t b = 0; b < B; ++b) {
      int32_t id = 0;  // what a finished row is fed (its output is never read)
      if (chosen[size_t(b)] >= 0) {
        id = chosen[size_t(b)];
        r.tokens[size_t(b)].push_back(id);
        ++r.stats.generated_tokens;
        if (on_token) on_token(b, id);
        if (std::find(o.stop_tokens.begin(), o.stop_tokens.end(), id) != o.stop_tokens.end()) {
          r.finish_reason[size_t(b)] = "stop";
          ++done;
        }
      }
      seq[size_t(b)].push_back(id);
    }
    ++len;
    const int64_t generated = len - P;
    if (done == B) break;
    if (generated >= o.max_new_tokens || len > S) {  // the next run would need slot S
      for (auto& reason : r.finish_reason)
        if (reason.empty()) reason = generated >= o.max_new_tokens ? "length" : "context";
      break;
    }
  }
  return r;
}

}  // namespace fusetune
