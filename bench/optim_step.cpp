// Optimizer-side cost per training step: AdamW and 8-bit AdamW updates and grad-norm clipping
// over n fp32 parameters. Memory-bound; reported as bytes moved per second. Nothing here asserts a
// time.
#include <benchmark/benchmark.h>

#include <cmath>
#include <vector>

#include "fusetune/optim/adamw.h"
#include "fusetune/optim/adamw8bit.h"
#include "fusetune/optim/grad_clip.h"

using namespace fusetune;

namespace {

struct Params {
  Tensor p, g;
  std::vector<ParamRef> refs;
  explicit Params(int64_t n)
      : p(Tensor::empty({n}, DType::F32)), g(Tensor::empty({n}, DType::F32)) {
    for (int64_t i = 0; i < n; ++i) {
      p.data<float>()[i] = std::sin(float(i));
      g.data<float>()[i] = 1e-3f * std::cos(float(i));
    }
    refs = {{"w", &p, &g}};
  }
};

void BM_AdamWStep(benchmark::State& state) {
  Params ps(state.range(0));
  AdamW opt;
  for (auto _ : state) opt.step(ps.refs, 1e-4);
  // Reads p, g, m, v; writes p, m, v: 7 x 4 bytes per element.
  state.SetBytesProcessed(int64_t(state.iterations()) * state.range(0) * 28);
}
BENCHMARK(BM_AdamWStep)->Arg(1 << 20)->Arg(1 << 24)->Unit(benchmark::kMillisecond);

// An L3-micro embedding table [128256, 256] whose gradient touches range(0) rows (a batch of 4 x
// 256 tokens touches a few hundred): AdamW's lazy rows (optim/adamw.cpp) read only those rows and
// decay the others' values (weight_decay 0.01) or skip them (range(1) = 1: weight_decay 0).
// range(0) = 128256 is the dense update of the same table, in the same run.
void BM_AdamWEmbeddingRows(benchmark::State& state) {
  const int64_t V = 128256, D = 256, touched = state.range(0);
  Tensor p = Tensor::empty({V, D}, DType::F32), g = Tensor::zeros({V, D}, DType::F32);
  for (int64_t i = 0; i < V * D; ++i) p.data<float>()[i] = std::sin(float(i));
  for (int64_t k = 0; k < touched; ++k) {
    const int64_t row = k * (V / touched);
    for (int64_t j = 0; j < D; ++j) g.data<float>()[row * D + j] = 1e-3f * std::cos(float(j + k));
  }
  AdamWOptions o;
  if (state.range(1)) o.weight_decay = 0;
  AdamW opt(o);
  std::vector<ParamRef> refs = {{"tok_embeddings.weight", &p, &g}};
  for (auto _ : state) opt.step(refs, 1e-4);
  state.counters["touched_rows"] = double(touched);
}
BENCHMARK(BM_AdamWEmbeddingRows)
    ->Args({128256, 0})
    ->Args({1024, 0})
    ->Args({1024, 1})
    ->Unit(benchmark::kMillisecond);

void BM_AdamW8bitStep(benchmark::State& state) {
  Params ps(state.range(0));
  AdamW8bit opt;
  for (auto _ : state) opt.step(ps.refs, 1e-4);
  // Reads p, g and the 8-bit codes; writes p and the codes: 4 x 4 + 4 x 1 bytes per element.
  state.SetBytesProcessed(int64_t(state.iterations()) * state.range(0) * 20);
}
BENCHMARK(BM_AdamW8bitStep)->Arg(1 << 20)->Arg(1 << 24)->Unit(benchmark::kMillisecond);

void BM_ClipGradNorm(benchmark::State& state) {
  Params ps(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(clip_grad_norm(ps.refs, 1e9));  // no scaling
  state.SetBytesProcessed(int64_t(state.iterations()) * state.range(0) * 4);
}
BENCHMARK(BM_ClipGradNorm)->Arg(1 << 20)->Arg(1 << 24)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
